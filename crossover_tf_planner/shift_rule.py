"""The static time shift that starts job B against job A: the rule the shift scenario runs
and the planner's shift policy predicts, in one place so that both use the same offset.

The rule is CASSINI's (Rajasekaran et al., "CASSINI: Network-Aware Job Scheduling in Machine
Learning Clusters", NSDI 2024), the static, LCM-aligned shift that "Performance Analysis of
Communication Scheduling Schemes for Distributed Deep Learning" analyses (and finds to fail
to improve throughput in about 73% of multi-job scenarios):

1. Align the periods on their least common multiple: the ratio T_B/T_A is rounded to the
   nearest fraction n/d with d <= ``max_denominator`` (a measured ratio is never exact, and
   the LCM of two noisy periods is unbounded), and the hyperperiod is n * T_A = d * T_B'
   (T_B' = T_A * n/d, B's period on the circle).
2. Lay both jobs' steps on the circle of that hyperperiod (A: n steps, B: d steps; a step is
   its device phase, its allreduce, then the rest) and rotate B by the shift that minimises
   the time both allreduces are in flight. Shifts repeat every gcd of the periods
   (T_A / d), so the search covers [0, T_A / d).
3. Among equal overlaps, take the shift nearest the natural interleave, B starting its
   compute as A starts its allreduce (shift D_A): for equal periods this puts A's allreduce
   under B's compute, the shift the paper and CASSINI use for two equal jobs.

Static, as the schemes studied are: computed once from the calibrated periods, applied once
after the start barrier, never corrected. TF-free.
"""

from __future__ import annotations

import dataclasses
import fractions

import numpy as np

MAX_DENOMINATOR = 4  # LCM alignment over at most 4 periods of job B
GRID = 480  # candidate shifts per distinct-phase interval (besides the two exact ones)
TIE_S = 1e-9  # overlaps closer than this are equal


@dataclasses.dataclass(frozen=True)
class StepPhases:
    """One job's step on the circle: its device phase (compute and apply), its allreduce and
    the rest, in seconds, in that order."""

    device_s: float
    comm_s: float
    other_s: float = 0.0

    def __post_init__(self) -> None:
        if min(self.device_s, self.comm_s, self.other_s) < 0 or self.period_s <= 0:
            raise ValueError(f"step phases must be >= 0 with a positive period, got {self}")

    @property
    def period_s(self) -> float:
        return self.device_s + self.comm_s + self.other_s


@dataclasses.dataclass(frozen=True)
class ShiftPlan:
    """The rule's choice: B starts ``shift_s`` after A; over one hyperperiod (A's ``steps_a``
    steps, B's ``steps_b``) both allreduces are in flight ``overlap_s``, against
    ``random_overlap_s`` on average over all shifts (what naive co-location gets)."""

    shift_s: float
    hyperperiod_s: float
    steps_a: int
    steps_b: int
    overlap_s: float
    random_overlap_s: float

    @property
    def overlap_share(self) -> float:
        """The share of the hyperperiod in which both allreduces are in flight."""
        return self.overlap_s / self.hyperperiod_s

    def to_dict(self) -> dict[str, float]:
        return {**dataclasses.asdict(self), "overlap_share": self.overlap_share}


def lcm_alignment(period_a_s: float, period_b_s: float,
                  max_denominator: int = MAX_DENOMINATOR) -> tuple[int, int]:
    """(n, d): steps of A and of B in the hyperperiod, T_B/T_A rounded to n/d (d bounded)."""
    if period_a_s <= 0 or period_b_s <= 0 or max_denominator < 1:
        raise ValueError(f"periods must be positive and max_denominator >= 1, got "
                         f"{period_a_s}, {period_b_s}, {max_denominator}")
    ratio = fractions.Fraction(period_b_s / period_a_s).limit_denominator(max_denominator)
    if ratio == 0:
        ratio = fractions.Fraction(1, max_denominator)
    return ratio.numerator, ratio.denominator


def _circle_overlap_s(starts_a: np.ndarray, length_a: float, starts_b: np.ndarray,
                      length_b: float, circle_s: float) -> np.ndarray:
    """Total overlap of A's intervals with B's on a circle, for each row of ``starts_b``
    (shape (k, n_b)); intervals shorter than the circle, starts in [0, circle)."""
    a = starts_a[None, :, None, None]
    b = starts_b[:, None, :, None] + circle_s * np.array([-1.0, 0.0, 1.0])
    overlap = np.minimum(a + length_a, b + length_b) - np.maximum(a, b)
    return np.clip(overlap, 0.0, None).sum(axis=(1, 2, 3))


def comm_overlap_s(a: StepPhases, b: StepPhases, shifts_s: np.ndarray,
                   max_denominator: int = MAX_DENOMINATOR) -> np.ndarray:
    """Seconds per hyperperiod in which both jobs' allreduces are in flight, B started at each
    of ``shifts_s`` after A (B's period taken as the aligned T_A * n/d)."""
    steps_a, steps_b = lcm_alignment(a.period_s, b.period_s, max_denominator)
    circle = steps_a * a.period_s
    period_b = circle / steps_b
    starts_a = np.arange(steps_a) * a.period_s + a.device_s
    shifts = np.atleast_1d(np.asarray(shifts_s, float))
    starts_b = np.mod(shifts[:, None] + np.arange(steps_b) * period_b + b.device_s, circle)
    return _circle_overlap_s(np.mod(starts_a, circle), min(a.comm_s, a.period_s),
                             starts_b, min(b.comm_s, period_b), circle)


def choose_shift(a: StepPhases, b: StepPhases, max_denominator: int = MAX_DENOMINATOR
                 ) -> ShiftPlan:
    """The rule (module docstring): B's start shift, and the overlap it predicts."""
    steps_a, steps_b = lcm_alignment(a.period_s, b.period_s, max_denominator)
    circle = steps_a * a.period_s
    distinct = a.period_s / steps_b  # gcd of T_A and the aligned T_B
    natural = a.device_s % distinct
    exact = [natural, (-b.device_s) % distinct]  # A's allreduce under B's compute, and back
    candidates = np.concatenate([exact, np.arange(GRID) * distinct / GRID])
    overlaps = comm_overlap_s(a, b, candidates, max_denominator)
    best = overlaps.min()
    tied = np.flatnonzero(overlaps <= best + TIE_S)
    gap = np.abs(candidates[tied] - natural)
    distance = np.minimum(gap, distinct - gap)
    chosen = tied[np.argmin(distance)]  # stable: the exact candidates come first
    random = steps_a * a.comm_s * steps_b * min(b.comm_s, circle / steps_b) / circle
    return ShiftPlan(float(candidates[chosen]), circle, steps_a, steps_b,
                     float(overlaps[chosen]), float(random))
