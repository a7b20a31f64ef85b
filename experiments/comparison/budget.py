"""How long a comparison will take, and how many steps per run fit its time budget.

Why: one fresh-clone main job took 75 minutes against the 35 to 55 its README promised
(issue 34). The calibrated link sets the step time (a slower machine gets a slower link for the
same M/C), so nothing fixed the length, and nothing said it beforehand. The calibration's solo
runs measure what a run costs: a start-up paid per launch (processes, the backend's bring-up,
XLA's compiles) plus its steps, wall = start_up + steps x step. From that, the trials' length
at the comparison's link follows, and --budget_minutes shortens every run (fewer steps, never
fewer trials: the Williams square needs them all) until it fits.

Pure functions: comparison/run.py measures and prints.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Mapping, Sequence

from crossover_tf_planner import registry
from experiments.comparison.calibration import CalibrationPoint, CommFit

# Jobs running together finish their steps this much faster than one after the other. The
# main job measured naive 1.58-1.79x and crossing 1.6-1.85x sequential (README, measurements);
# the low end keeps the estimate on the long side.
CONCURRENT_SPEEDUP = 1.5
# Timed steps a run keeps at the least however tight the budget: the window guard needs 5 steps
# of every job in the concurrent window and half of each job's timed run; 20 leaves margin for
# the bootstrap interval (intervals.block_length).
MIN_TIMED_STEPS = 20


@dataclasses.dataclass(frozen=True)
class RunCost:
    """What one launch of one job costs: a fixed start-up, and a solo step at the link."""
    start_up_s: float
    step_s: float

    def solo_run_s(self, steps: int) -> float:
        return self.start_up_s + steps * self.step_s


def run_cost(calibration: Mapping[str, Any], bandwidth_mbit: float) -> RunCost | None:
    """The cost of a solo run at `bandwidth_mbit` from a calibration record (calibrate.py's):
    a step there is C + M(B) from the fit plus what else a calibration step did beyond its C
    and M (the median over the points); the start-up is the median of wall minus steps x
    step. None for a record without walls (written before them)."""
    points = [CalibrationPoint(**p) for p in calibration.get("points", ())]
    timed = [p for p in points if p.wall_s is not None and p.steps and p.step_s]
    if not timed or "fit" not in calibration:
        return None
    fit = CommFit(**calibration["fit"])
    other_s = statistics.median(max(p.step_s - p.compute_s - p.comm_s, 0.0) for p in timed)
    start_up = statistics.median(max(p.wall_s - p.steps * p.step_s, 0.0) for p in timed)
    return RunCost(start_up, calibration["compute_s"] + fit.comm_s(bandwidth_mbit) + other_s)


def trials_s(cost: RunCost, scenarios: Sequence[str], jobs: int, steps: int,
             trials: int) -> float:
    """The trials' length: sequential launches every job alone, one after another; a
    concurrent scenario launches them together, CONCURRENT_SPEEDUP faster."""
    solo = jobs * cost.solo_run_s(steps)
    per_trial = sum(solo if name == registry.SEQUENTIAL else solo / CONCURRENT_SPEEDUP
                    for name in scenarios)
    return trials * per_trial


def fitting_steps(cost: RunCost, scenarios: Sequence[str], jobs: int, trials: int,
                  asked_steps: int, warmup_steps: int, seconds: float) -> int:
    """The most steps per run, at most `asked_steps`, whose trials take at most `seconds`;
    never fewer than warm-up plus MIN_TIMED_STEPS (the run then overruns, and says so)."""
    floor = min(asked_steps, warmup_steps + MIN_TIMED_STEPS)
    fixed = trials_s(cost, scenarios, jobs, 0, trials)
    per_step = trials_s(cost, scenarios, jobs, 1, trials) - fixed
    fits = math.floor((seconds - fixed) / per_step) if per_step > 0 else asked_steps
    return max(floor, min(asked_steps, fits))
