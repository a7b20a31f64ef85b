"""The M/C sweep's table and plot: measured crossover ratios against measured M/C, with the
planner's predictions beside them (so a reader sees where the model holds and where not).

Rows come from compare.json results (one per asked-for ratio); pure formatting, no runs.
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Mapping, Sequence

from crossover_tf_planner import registry
from crossover_tf_planner.compare_record import Comparison
from experiments.analysis import intervals, report
from experiments.comparison import trials

MODELS = ("analytical", "simulated")


def _predicted(result: Comparison, ratio: registry.Ratio, model: str) -> float | None:
    """The planner's prediction of one ratio, median over trials (None without a planner)."""
    values = [t.planner["aggregate_images_ratios"][ratio.planner_key][model]
              for t in result.trials_or_self
              if model in (t.planner or {}).get("aggregate_images_ratios", {}).get(
                  ratio.planner_key, {})]
    return statistics.median(values) if values else None


def row(result: Comparison) -> dict[str, Any]:
    """One sweep point (a row of sweep.json) from a comparison: asked and achieved M/C, the
    bandwidth, per ratio the measured spread, its bootstrap interval and each model's
    prediction, and the recommendations."""
    regime = result.regime
    spreads = report.spreads_of(result)
    found = result.ratio_interval
    return {"comm_to_compute_asked": regime.comm_to_compute_asked,
            "achieved_comm_to_compute": regime.achieved_comm_to_compute.to_dict(),
            "bandwidth_mbit": regime.bandwidth_mbit, "trials": result.trials,
            **{r.key: {"measured": spreads[r.key].to_dict(),
                       "interval": (dataclasses.asdict(found[r.key]) if r.key in found
                                    else None),
                       **{model: _predicted(result, r, model) for model in MODELS}}
               for r in registry.SWEPT if r.key in spreads},
            "recommendation": trials.verdict(result)}


def _prediction(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _measured(point: Mapping[str, Any]) -> str:
    """"median [min–max]; 95% low–high (call)": the spread, and the interval beside it."""
    interval = point.get("interval")
    spread = report.with_spread(point["measured"])
    if not interval:
        return spread
    return f"{spread}; 95% {intervals.describe(intervals.Interval(**interval))}"


def _ratios_shown(rows: Sequence[Mapping[str, Any]]) -> list[registry.Ratio]:
    return [ratio for ratio in registry.SWEPT if any(ratio.key in r for r in rows)]


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line per M/C point: measured median [min–max] with its 95% interval, predicted
    (the cpu model / the gpu-like simulator), and the planner's recommendation against the
    measured winner, with the verdict's rule under the table."""
    shown = _ratios_shown(rows)
    lines = ["| M/C asked | M/C measured | Mbit/s | " + " | ".join(
                f"{r.planner_key} measured | predicted (cpu model / gpu-like sim)" for r in shown)
             + " | recommended | measured winner |",
             "|---:|---:|---:|" + "---:|---:|" * len(shown) + "---|---|"]
    for r in rows:
        asked = r["comm_to_compute_asked"]  # None: a fixed link's comparison, tabulated beside
        cells = ["—" if asked is None else f"{asked:g}", report.with_spread(
            r["achieved_comm_to_compute"], 2), f"{r['bandwidth_mbit']:.4g}"]
        for key in (ratio.key for ratio in shown):
            if key not in r:
                cells += ["—", "—"]
                continue
            cells += [_measured(r[key]),
                      " / ".join(_prediction(r[key][m]) for m in MODELS)]
        cells += [*trials.verdict_cells(r.get("recommendation", {}))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", trials.VERDICT_RULE]) + "\n"


def plot(rows: Sequence[Mapping[str, Any]], path: str) -> None:
    """One panel per ratio: measured median with min–max bars and the per-trial points
    against measured M/C, the planner's predictions at the same M/C, and the break-even line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = _ratios_shown(rows)
    fig, axes = plt.subplots(1, len(shown), figsize=(6 * len(shown), 4.5), squeeze=False)
    for ax, ratio in zip(axes[0], shown):
        key, label = ratio.key, ratio.planner_key
        present = [r for r in rows if key in r]
        x = [r["achieved_comm_to_compute"]["median"] for r in present]
        measured = [r[key]["measured"] for r in present]
        medians = [m["median"] for m in measured]
        ax.errorbar(x, medians, yerr=[[m["median"] - m["min"] for m in measured],
                                      [m["max"] - m["median"] for m in measured]],
                    fmt="o-", color="tab:red", capsize=5, label="measured median [min–max]")
        for xi, m in zip(x, measured):
            ax.plot([xi] * len(m["values"]), m["values"], "k.", alpha=0.5)
        for model, marker in zip(MODELS, ("s--", "^:")):
            points = [(xi, r[key][model]) for xi, r in zip(x, present)
                      if r[key][model] is not None]
            if points:
                ax.plot(*zip(*points), marker, label=f"predicted ({model})")
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("M/C measured (solo allreduce / device time per step)")
        ax.set_title(label)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
