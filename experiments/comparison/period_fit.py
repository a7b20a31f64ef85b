"""Choosing job B's batch so that its period T_B is an asked-for multiple of job A's T_A.

Why: every measured pair had two equal jobs (T_B/T_A = 1), the one case where a static shift
is easiest (issue 50). A job's step grows with its batch (compute) while its allreduce does
not (the same gradients), so T(b) = fixed + per_image * b: two solo runs of B at two batches
fit it, and b* = (r * T_A - fixed) / per_image gives T_B/T_A = r. The batch is rounded to a
multiple of the hosts (each rank gets an equal share). The ratio is held like M/C
(analysis/regime.py): a trial whose solo runs are more than TOLERANCE off re-picks B's batch
for the next, the fit's fixed part kept and its slope rescaled through B's measured step.

Pure functions only: period_calibrate.py runs the solo runs.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Sequence

TOLERANCE = 0.10  # a T_B/T_A within +-10% of the asked-for ratio is in the regime
MAX_POINTS = 3  # solo runs of job B at most
# Job B's batch stays within this factor of job A's: a step that barely grows with the batch
# (a tiny model, all Python overhead) would ask for a batch larger than the data set.
MAX_BATCH_FACTOR = 8


@dataclasses.dataclass(frozen=True)
class PeriodPoint:
    """One solo run of job B: its global batch and its step (seconds)."""
    batch: int
    step_s: float


@dataclasses.dataclass(frozen=True)
class StepFit:
    """T(b) = fixed_s + per_image_s * b."""
    fixed_s: float
    per_image_s: float

    def step_s(self, batch: float) -> float:
        return self.fixed_s + self.per_image_s * batch


def in_tolerance(ratio: float, asked: float) -> bool:
    """Whether an achieved T_B/T_A is within TOLERANCE of the asked-for one."""
    return abs(ratio / asked - 1) <= TOLERANCE


def fit_step(points: Sequence[PeriodPoint]) -> StepFit:
    """Least-squares line through the points (two distinct batches at least); a clear error
    where the step did not grow with the batch (nothing then sets the period)."""
    batches = {p.batch for p in points}
    if len(batches) < 2:
        raise ValueError(f"need solo runs of job B at >= 2 distinct batches, got "
                         f"{sorted(batches)}")
    x_mean = statistics.fmean(p.batch for p in points)
    y_mean = statistics.fmean(p.step_s for p in points)
    slope = (sum((p.batch - x_mean) * (p.step_s - y_mean) for p in points)
             / sum((p.batch - x_mean) ** 2 for p in points))
    if slope <= 0:
        raise ValueError("job B's step did not grow with its batch ("
                         + ", ".join(f"batch {p.batch}: {1e3 * p.step_s:.0f} ms" for p in points)
                         + "): no batch sets its period; try --job_b_model")
    return StepFit(y_mean - slope * x_mean, slope)


def batch_for(fit: StepFit, target_step_s: float, multiple: int,
              largest: int | None = None) -> int:
    """The batch (a positive multiple of `multiple`, at most `largest`) whose fitted step is
    nearest the target; a clear error where no batch in that range reaches it."""
    exact = (target_step_s - fit.fixed_s) / fit.per_image_s
    if exact < multiple / 2:
        raise ValueError(f"job B cannot step as fast as {1e3 * target_step_s:.0f} ms: its "
                         f"step is {1e3 * fit.fixed_s:.0f} ms before any image; ask for a "
                         "larger --period_ratio or give job B a smaller --job_b_model")
    if largest is not None and exact > largest:
        raise ValueError(f"job B would need a batch of {exact:.0f} to step in "
                         f"{1e3 * target_step_s:.0f} ms, more than {largest}: its step barely "
                         "grows with its batch; give job B a larger --job_b_model")
    return max(multiple, multiple * round(exact / multiple))


def first_batch(batch_a: int, ratio: float, multiple: int) -> int:
    """Where to measure job B first: A's batch scaled by the ratio (a step all compute)."""
    return max(multiple, multiple * round(batch_a * ratio / multiple))


def second_batch(first: PeriodPoint, target_step_s: float, multiple: int) -> int:
    """Where to measure next: the first point's guess through the origin, kept at least a
    factor 1.5 away from the first batch so that the fit's slope rises above the noise."""
    guess = first.batch * target_step_s / first.step_s
    low, high = first.batch / 1.5, first.batch * 1.5
    if low < guess < high:
        guess = high if guess >= first.batch else low
    return max(multiple, multiple * round(guess / multiple))


def rebatched(fit: StepFit, batch: int, measured_step_s: float, target_step_s: float,
              multiple: int, largest: int | None = None) -> int:
    """The batch that brings a drifted trial back to the target step: the fit's fixed part
    kept, its slope rescaled through job B's measured step at `batch`."""
    slope = (measured_step_s - fit.fixed_s) / batch
    latest = StepFit(fit.fixed_s, slope) if slope > 0 else fit
    return batch_for(latest, target_step_s, multiple, largest)


def steps_for(steps: int, warmup_steps: int, ratio: float) -> int:
    """Job B's steps: its timed steps divided by the ratio, so that both jobs' timed runs
    last about as long (the window guard wants half of each inside the common window)."""
    return warmup_steps + max(1, math.ceil((steps - warmup_steps) / ratio))
