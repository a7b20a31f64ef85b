"""Markdown table and PNG figure of a comparison (what compare.py prints and writes)."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from crossover_tf_planner.job_stats import JobStats
from crossover_tf_planner.policies import MEASURED

SCENARIO_ORDER = ("solo_A", "solo_B", *MEASURED)


def markdown(result: Mapping[str, Any]) -> str:
    """Per-job and aggregate throughput per scenario, then the ratios and the ideal."""
    lines = ["| scenario | job A images/s | job B images/s | aggregate images/s |",
             "|---|---:|---:|---:|"]
    for name in SCENARIO_ORDER:
        scenario = result["scenarios"].get(name)
        if scenario is None:
            continue
        jobs = scenario["jobs"]
        cells = [f"{jobs[j]['images_per_s']:.1f}" if j in jobs else "" for j in ("A", "B")]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | "
                     f"{scenario['aggregate_images_per_s']:.1f} |")
    r = result["ratios"]
    lines += ["", "| ratio | value |", "|---|---:|",
              f"| crossover / sequential | {r['crossover_over_sequential']:.3f} |",
              f"| crossover / naive | {r['crossover_over_naive']:.3f} |",
              f"| ideal (from solo C, M) | {r['ideal_crossover_over_sequential']:.3f} |",
              f"| measured / ideal | {r['measured_over_ideal']:.3f} |"]
    lines += ["", "| job | compute C (ms) | comm M (ms) | solo step (ms) |", "|---|---:|---:|---:|"]
    for job in ("A", "B"):
        solo = JobStats.from_dict(result["scenarios"][f"solo_{job}"]["jobs"][job])
        lines.append(f"| {job} | {1e3 * solo.device_s:.1f} | {1e3 * solo.comm_s:.1f} | "
                     f"{1e3 * solo.step_time_s:.1f} |")
    return "\n".join(lines) + "\n"


def plot(result: Mapping[str, Any], crossover_phases: Mapping[str, np.ndarray], path: str,
         max_steps: int = 8) -> None:
    """Left: throughput bars per scenario (stacked by job). Right: host 0's lease timeline in
    the crossover run, showing A's compute over B's communication and vice versa."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, lanes) = plt.subplots(1, 2, figsize=(13, 4.5),
                                      gridspec_kw={"width_ratios": [1, 1.6]})
    names = [n for n in SCENARIO_ORDER if n in result["scenarios"]]
    bottom = np.zeros(len(names))
    for job, color in (("A", "tab:blue"), ("B", "tab:orange")):
        values = np.array([result["scenarios"][n]["per_job_in_aggregate"].get(job, 0.0)
                           for n in names])
        bars.bar(names, values, bottom=bottom, color=color, label=f"job {job}")
        bottom += values
    bars.set_ylabel("images/s (aggregate, stacked by job)")
    bars.set_title("throughput")
    bars.legend()
    bars.tick_params(axis="x", rotation=20)

    shown = {job: np.asarray(p)[-max_steps:] for job, p in crossover_phases.items()}
    origin = min(p[0, 0] for p in shown.values() if len(p))
    rows = []
    for job, color in (("A", "tab:blue"), ("B", "tab:orange")):
        p = (shown[job] - origin) / 1e6  # ms
        rows.append((f"{job} compute", [(s, e - s) for s, e in p[:, [0, 1]]], color))
        rows.append((f"{job} allreduce", [(s, e - s) for s, e in p[:, [1, 2]]], "lightgray"))
        rows.append((f"{job} apply", [(s, e - s) for s, e in p[:, [3, 4]]], color))
    for i, (label, spans, color) in enumerate(rows):
        lanes.broken_barh(spans, (i - 0.4, 0.8), facecolors=color, edgecolor="black",
                          linewidth=0.3)
    lanes.set_yticks(range(len(rows)), [r[0] for r in rows])
    lanes.invert_yaxis()
    lanes.set_xlabel("ms (host 0, last steps of the crossover run)")
    lanes.set_title("device lease timeline: compute crossed with the peer's allreduce")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
