"""Where does shifting help, where does crossing help: a grid over job shapes.

Each grid point is a pair: job A with period ``base_period_s`` and compute/comm
ratio ``r_A``; job B with period ``p * base_period_s`` and ratio ``r_B``.  For
every pair the analytical model gives naive, shift and crossover throughput;
a method "helps" when it beats naive co-location (the baseline CASSINI's 73%
finding is measured against) by more than ``threshold``.  Output: headline
fractions, a markdown table and a PNG heat map.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

import numpy as np

from crossover_tf_planner import analytical
from crossover_tf_planner.policies import PREDICTED

DEFAULT_CM_RATIOS = tuple(float(x) for x in np.logspace(-1, 1, 7))
DEFAULT_PERIOD_RATIOS = tuple(float(x) for x in np.linspace(1, 4, 13))
# (C/M of job A, T_B/T_A): the cells the shift experiment (scripts/run_shift.sh) measures, job
# A at M/C 1 and job B at 1, 1.5 and 2 times its period; marked on the table and the heat map
# until docs/planner.md holds their measurements.
MEASURED_CELLS = ((1.0, 1.0), (1.0, 1.5), (1.0, 2.0))


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """Normalised throughputs on the grid, indexed [r_A, r_B, period ratio]."""

    cm_ratios: tuple[float, ...]
    period_ratios: tuple[float, ...]
    threshold: float
    normalised: dict[str, np.ndarray]

    def helps(self, policy: str, baseline: str = "naive") -> np.ndarray:
        """Boolean grid: ``policy`` beats ``baseline`` by more than the threshold."""
        return self.normalised[policy] > self.normalised[baseline] * (1 + self.threshold)

    def headline(self) -> dict[str, float]:
        shift, cross = self.helps("shift"), self.helps("crossover")
        cross_beats_shift = self.helps("crossover", "shift")
        return {
            "pairs": int(shift.size),
            "shift_helps_vs_naive": float(shift.mean()),
            "crossover_helps_vs_naive": float(cross.mean()),
            "crossover_turn_helps_vs_naive":
                float(self.helps("crossover_turn").mean()),
            "crossover_helps_where_shift_fails": float(cross[~shift].mean()) if (~shift).any()
            else 0.0,
            "neither_helps": float((~shift & ~cross).mean()),
            "crossover_beats_shift": float(cross_beats_shift.mean()),
            "shift_beats_crossover": float(self.helps("shift", "crossover").mean()),
            "shift_helps_vs_sequential": float(self.helps("shift", "sequential").mean()),
            "crossover_helps_vs_sequential": float(self.helps("crossover", "sequential").mean()),
            "median_crossover_gain_vs_naive": float(np.median(
                self.normalised["crossover"] / self.normalised["naive"] - 1)),
            "median_shift_gain_vs_naive": float(np.median(
                self.normalised["shift"] / self.normalised["naive"] - 1)),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"cm_ratios": list(self.cm_ratios), "period_ratios": list(self.period_ratios),
                "threshold": self.threshold, "headline": self.headline(),
                "normalised": {k: v.tolist() for k, v in self.normalised.items()}}

    def measured_cells(self) -> list[tuple[int, int]]:
        """(C/M index, period index) of each of MEASURED_CELLS on this grid (nearest point;
        none off the grid's range)."""
        cells = []
        for cm, period in MEASURED_CELLS:
            if not (min(self.cm_ratios) <= cm <= max(self.cm_ratios)
                    and min(self.period_ratios) <= period <= max(self.period_ratios)):
                continue
            cells.append((int(np.argmin(np.abs(np.log(np.array(self.cm_ratios) / cm)))),
                          int(np.argmin(np.abs(np.array(self.period_ratios) - period)))))
        return cells

    def to_markdown(self) -> str:
        """Rows: period ratio; columns: C/M of job A; cell: share of job-B shapes
        where shift / crossover helps (†: a cell the shift experiment measures)."""
        shift = self.helps("shift").mean(axis=1)
        cross = self.helps("crossover").mean(axis=1)
        marked = set(self.measured_cells())
        header = "| T_B/T_A \\ C/M of A | " + " | ".join(f"{r:.2g}" for r in self.cm_ratios) + " |"
        lines = [header, "|---" * (len(self.cm_ratios) + 1) + "|"]
        for j, p in enumerate(self.period_ratios):
            cells = " | ".join(f"{shift[i, j]:.0%} / {cross[i, j]:.0%}"
                               + ("†" if (i, j) in marked else "")
                               for i in range(len(self.cm_ratios)))
            lines.append(f"| {p:.3g} | {cells} |")
        h = self.headline()
        return "\n".join([
            f"Share of {h['pairs']} job pairs where each method beats naive co-location "
            f"by more than {self.threshold:.0%} (cell: shift / crossover, over job B's C/M "
            "ratios).", "", *lines, "",
            f"- shift helps: {h['shift_helps_vs_naive']:.1%}; crossover helps: "
            f"{h['crossover_helps_vs_naive']:.1%}; crossover with link turns "
            "(per-round formula): "
            f"{h['crossover_turn_helps_vs_naive']:.1%}",
            f"- where shift fails, crossover helps in "
            f"{h['crossover_helps_where_shift_fails']:.1%}; neither helps in "
            f"{h['neither_helps']:.1%}",
            f"- crossover beats shift in {h['crossover_beats_shift']:.1%}, shift beats "
            f"crossover in {h['shift_beats_crossover']:.1%}",
            *(["- †: cells the shift experiment (scripts/run_shift.sh) measures"]
              if marked else [])])


def grid_pairs(cm_ratios: Sequence[float], period_ratios: Sequence[float],
               base_period_s: float, handoff_s: float) -> analytical.PairTimes:
    """Phase times of every (r_A, r_B, p) pair, flattened in C order."""
    r = np.asarray(cm_ratios, float)
    p = np.asarray(period_ratios, float)
    if r.size == 0 or p.size == 0 or np.any(r <= 0) or np.any(p <= 0):
        raise ValueError("cm_ratios and period_ratios must be non-empty and > 0")
    if base_period_s <= 0 or handoff_s < 0:
        raise ValueError("base_period_s must be > 0 and handoff_s >= 0")
    ra, rb, pp = (x.reshape(-1) for x in np.meshgrid(r, r, p, indexing="ij"))
    period = base_period_s * np.stack([np.ones_like(pp), pp], axis=1)
    ratio = np.stack([ra, rb], axis=1)
    zeros = np.zeros_like(period)
    device = period * ratio / (1 + ratio)
    return analytical.PairTimes(device_s=device, link_s=period / (1 + ratio), other_s=zeros,
                                handoff_s=zeros + handoff_s, device_std_s=zeros,
                                link_std_s=zeros, comm_cpu_s=zeros, cpu_s=device)


def run_sweep(cm_ratios: Sequence[float] = DEFAULT_CM_RATIOS,
              period_ratios: Sequence[float] = DEFAULT_PERIOD_RATIOS, *,
              base_period_s: float = 0.1, handoff_s: float = 2e-4, threshold: float = 0.05,
              n_offsets: int = 8, n_events: int = 1200) -> SweepResult:
    """Evaluates every grid pair with the analytical model."""
    times = grid_pairs(cm_ratios, period_ratios, base_period_s, handoff_s)
    steps = analytical.policy_steps_per_s(times, n_offsets=n_offsets, n_events=n_events)
    shape = (len(cm_ratios), len(cm_ratios), len(period_ratios))
    normalised = {policy: analytical.normalised_throughput(steps[policy], times).reshape(shape)
                  for policy in PREDICTED}
    return SweepResult(tuple(cm_ratios), tuple(period_ratios), threshold, normalised)


def save_heatmap(result: SweepResult, path: str | os.PathLike) -> str:
    """Two panels (shift, crossover): share of job-B shapes where the method helps."""
    import matplotlib  # local: only plotting needs it, and its import is slow
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    cells = result.measured_cells()
    if cells:
        fig.subplots_adjust(bottom=0.17)  # room for the legend of the marked cells
    for axis, policy in zip(axes, ("shift", "crossover")):
        share = result.helps(policy).mean(axis=1).T
        image = axis.imshow(share, origin="lower", aspect="auto", vmin=0, vmax=1, cmap="viridis")
        axis.set_xticks(range(len(result.cm_ratios)),
                        [f"{r:.2g}" for r in result.cm_ratios])
        axis.set_yticks(range(len(result.period_ratios)),
                        [f"{p:.3g}" for p in result.period_ratios])
        axis.set_xlabel("compute / comm ratio of job A")
        axis.set_title(f"{policy} beats naive by >{result.threshold:.0%} "
                       f"({result.helps(policy).mean():.0%} of pairs)")
        for column, row in cells:  # where measurements will go
            axis.add_patch(plt.Rectangle((column - 0.5, row - 0.5), 1, 1, fill=False,
                                         edgecolor="red", linewidth=2))
    axes[0].set_ylabel("period ratio T_B / T_A")
    fig.colorbar(image, ax=axes, label="share of job-B C/M ratios")
    if cells:
        fig.text(0.4, 0.01, "red: cells the shift experiment measures (scripts/run_shift.sh)",
                 fontsize=9, color="red", ha="center")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
