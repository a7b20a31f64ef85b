"""Markdown table and PNG figure of a comparison (what compare.py prints and writes)."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from crossover_tf_planner.job_stats import JobStats
from crossover_tf_planner.policies import MEASURED
from experiments import trials

SCENARIO_ORDER = ("solo_A", "solo_B", *MEASURED)


RATIO_ROWS = (("crossover_over_sequential", "crossover / sequential"),
              ("crossover_over_naive", "crossover / naive"),
              ("ideal_crossover_over_sequential", "ideal (from solo C, M)"),
              ("measured_over_ideal", "measured / ideal"))


def with_spread(spread: Mapping[str, float] | float, digits: int = 3) -> str:
    """"median [min–max]" of a spread record, or a plain value (a single trial)."""
    if not isinstance(spread, Mapping):
        return f"{spread:.{digits}f}"
    if spread["min"] == spread["max"]:
        return f"{spread['median']:.{digits}f}"
    return f"{spread['median']:.{digits}f} [{spread['min']:.{digits}f}–{spread['max']:.{digits}f}]"


def _regime_lines(result: Mapping[str, Any]) -> list[str]:
    """Which M/C was asked for, which bandwidth gave it, and what the solo runs achieved."""
    regime = result.get("regime")
    if not regime:
        return []
    asked = regime.get("comm_to_compute_asked")
    source = regime.get("bandwidth_source", "fixed")
    if not result.get("settings", {}).get("cluster", {}).get("emulated", True):
        source += ", NOT applied: localhost fallback"
    lines = ["", "| regime | value |", "|---|---:|",
             f"| M/C asked for | {'—' if asked is None else f'{asked:g}'} |",
             f"| M/C achieved (solo runs) | {with_spread(regime['achieved_comm_to_compute'])} |",
             f"| bandwidth (Mbit/s, {source}) | {regime['bandwidth_mbit']:.4g} |"]
    return lines


def markdown(result: Mapping[str, Any]) -> str:
    """Per-job and aggregate throughput per scenario, the ratios (median [min–max] over trials
    when there are several), the regime, and each job's solo C and M."""
    n_trials = result.get("trials", 1)
    shown = (f" (trial {result['representative_trial']}: median crossover / naive)"
             if n_trials > 1 else "")
    lines = [f"| scenario{shown} | job A images/s | job B images/s | aggregate images/s |",
             "|---|---:|---:|---:|"]
    for name in SCENARIO_ORDER:
        scenario = result["scenarios"].get(name)
        if scenario is None:
            continue
        jobs = scenario["jobs"]
        cells = [f"{jobs[j]['images_per_s']:.1f}" if j in jobs else "" for j in ("A", "B")]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | "
                     f"{scenario['aggregate_images_per_s']:.1f} |")
    spreads = result.get("ratio_spread", result["ratios"])
    header = f"median [min–max] of {n_trials} trials" if n_trials > 1 else "value"
    lines += ["", f"| ratio | {header} |", "|---|---:|"]
    lines += [f"| {label} | {with_spread(spreads[key])} |" for key, label in RATIO_ROWS]
    lines += _regime_lines(result)
    lines += ["", "| job | compute C (ms) | comm M (ms) | solo step (ms) |", "|---|---:|---:|---:|"]
    for job in ("A", "B"):
        solo = JobStats.from_dict(result["scenarios"][f"solo_{job}"]["jobs"][job])
        lines.append(f"| {job} | {1e3 * solo.device_s:.1f} | {1e3 * solo.comm_s:.1f} | "
                     f"{1e3 * solo.step_time_s:.1f} |")
    return "\n".join(lines) + "\n"


def plot(result: Mapping[str, Any], crossover_phases: Mapping[str, np.ndarray], path: str,
         max_steps: int = 8) -> None:
    """Left: throughput bars per scenario (stacked by job, the median trial) with every trial's
    aggregate as a dot. Middle: each ratio's per-trial values and median with min–max bars.
    Right: host 0's lease timeline in the crossover run, showing A's compute over B's
    communication and vice versa."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, ratios, lanes) = plt.subplots(1, 3, figsize=(17, 4.5),
                                              gridspec_kw={"width_ratios": [1, 0.8, 1.6]})
    _throughput_panel(bars, result)
    _ratio_panel(ratios, result)
    _timeline_panel(lanes, crossover_phases, max_steps)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _throughput_panel(ax: Any, result: Mapping[str, Any]) -> None:
    names = [n for n in SCENARIO_ORDER if n in result["scenarios"]]
    bottom = np.zeros(len(names))
    for job, color in (("A", "tab:blue"), ("B", "tab:orange")):
        values = np.array([result["scenarios"][n]["per_job_in_aggregate"].get(job, 0.0)
                           for n in names])
        ax.bar(names, values, bottom=bottom, color=color, label=f"job {job}")
        bottom += values
    for trial in result.get("per_trial", ()):
        ax.plot(names, [trial["scenarios"][n]["aggregate_images_per_s"] for n in names], "k.",
                label="each trial" if trial is result["per_trial"][0] else None)
    ax.set_ylabel("images/s (aggregate, stacked by job)")
    ax.set_title("throughput")
    ax.legend()
    ax.tick_params(axis="x", rotation=20)


def _ratio_panel(ax: Any, result: Mapping[str, Any]) -> None:
    spreads = result.get("ratio_spread") or {
        k: trials.spread([v]) for k, v in result["ratios"].items()}
    keys = [k for k, _ in RATIO_ROWS[:2]] + ["naive_over_sequential"]
    for i, key in enumerate(keys):
        s = spreads[key]
        below, above = s["median"] - s["min"], s["max"] - s["median"]
        ax.errorbar([i], [s["median"]], yerr=[[below], [above]], fmt="o", color="tab:red",
                    capsize=6, label="median [min–max]" if not i else None)
        ax.plot([i] * len(s["values"]), s["values"], "k.",
                label="each trial" if not i else None)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks(range(len(keys)), [k.replace("_over_", " /\n") for k in keys])
    ax.set_title(f"ratios over {result.get('trials', 1)} trial(s)")
    ax.legend()


def _timeline_panel(ax: Any, crossover_phases: Mapping[str, np.ndarray], max_steps: int) -> None:
    shown = {job: np.asarray(p)[-max_steps:] for job, p in crossover_phases.items()}
    origin = min(p[0, 0] for p in shown.values() if len(p))
    rows = []
    for job, color in (("A", "tab:blue"), ("B", "tab:orange")):
        p = (shown[job] - origin) / 1e6  # ms
        rows.append((f"{job} compute", [(s, e - s) for s, e in p[:, [0, 1]]], color))
        rows.append((f"{job} allreduce", [(s, e - s) for s, e in p[:, [1, 2]]], "lightgray"))
        rows.append((f"{job} apply", [(s, e - s) for s, e in p[:, [3, 4]]], color))
    for i, (label, spans, color) in enumerate(rows):
        ax.broken_barh(spans, (i - 0.4, 0.8), facecolors=color, edgecolor="black",
                       linewidth=0.3)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ms (host 0, last steps of the crossover run)")
    ax.set_title("device lease timeline: compute crossed with the peer's allreduce")
