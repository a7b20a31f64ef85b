"""Choosing the link bandwidth that gives an asked-for comm/compute ratio M/C.

Compute C (device time per step) barely depends on the link; allreduce M does, as
M(B) = m0 + k/B: a fixed part m0 (latency, Gloo's reduction, Horovod's cycle) plus bytes over
bandwidth. Two short solo runs at different bandwidths fit m0 and k, and B* = k / (r*C - m0)
gives M/C = r. A machine that is slower or busier has a larger C and gets a lower B*, so the
comparison runs in the same regime everywhere instead of at a bandwidth tuned on one machine.

On a busy machine M is noisy (stragglers between ranks, other processes on the cores), so the
search is bounded but adaptive: when two points do not give a usable fit, or the bandwidth they
give lies far outside the measured range, next_bandwidth says where to measure next (a slower
link, where the bandwidth term outgrows the noise, or the fit's own guess), up to MAX_POINTS.

Pure functions only: compare.py runs the calibration jobs and records the points.
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import Sequence

# Bounds on any bandwidth chosen here: below 1 Mbit/s a step takes minutes; above 100 Gbit/s
# tc's token bucket and the veth pair, not the configured rate, set the pace.
MIN_MBIT, MAX_MBIT = 1.0, 100_000.0
# The second calibration point stays at least this factor away from the first (a fit through
# two nearly equal bandwidths amplifies noise) and at most MAX_STEP away (extrapolating less).
MIN_STEP, MAX_STEP = 2.0, 16.0
# Calibration runs at most: a noisy machine gets further points, never an unbounded search.
MAX_POINTS = 4


@dataclasses.dataclass(frozen=True)
class CalibrationPoint:
    """One solo calibration run: its bandwidth and the measured per-step C and M."""
    bandwidth_mbit: float
    compute_s: float  # device time per step, C = JobStats.device_s
    comm_s: float  # allreduce per step, M = JobStats.comm_s
    wall_s: float | None = None  # the whole run, start-up included (budget.py's estimate)
    steps: int | None = None  # steps it ran, warm-up included
    step_s: float | None = None  # its median step (C, M and what else a step does)


@dataclasses.dataclass(frozen=True)
class CommFit:
    """M(B) = fixed_s + per_mbit_s / B, with B in Mbit/s."""
    fixed_s: float  # m0
    per_mbit_s: float  # k: seconds at 1 Mbit/s

    def comm_s(self, bandwidth_mbit: float) -> float:
        return self.fixed_s + self.per_mbit_s / bandwidth_mbit


def fit_comm_model(points: Sequence[CalibrationPoint]) -> CommFit:
    """Least-squares fit of M = m0 + k/B over the points (exact through two points)."""
    bandwidths = {p.bandwidth_mbit for p in points}
    if len(bandwidths) < 2:
        raise ValueError(f"need calibration points at >= 2 distinct bandwidths, got "
                         f"{sorted(bandwidths)}")
    xs = [1.0 / p.bandwidth_mbit for p in points]
    ys = [p.comm_s for p in points]
    x_mean, y_mean = statistics.fmean(xs), statistics.fmean(ys)
    k = (sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys))
         / sum((x - x_mean) ** 2 for x in xs))
    if k <= 0:
        raise ValueError(
            "allreduce time did not grow as bandwidth fell ("
            + ", ".join(f"{p.bandwidth_mbit:g} Mbit/s: M={1e3 * p.comm_s:.1f} ms"
                        for p in points)
            + "); the link is not the bottleneck (is the cluster shaped?), so no bandwidth "
              "sets M/C")
    return CommFit(fixed_s=y_mean - k * x_mean, per_mbit_s=k)


def compute_time(points: Sequence[CalibrationPoint]) -> float:
    """C for choosing the bandwidth: the median over calibration runs."""
    return statistics.median(p.compute_s for p in points)


def smallest_ratio(fit: CommFit, compute_s: float) -> float:
    """The M/C an infinitely fast link would give (m0/C): no bandwidth gets below it."""
    return max(fit.fixed_s, 0.0) / compute_s


def choose_bandwidth(fit: CommFit, compute_s: float, ratio: float) -> float:
    """B* with M(B*)/C = ratio; a clear error when the ratio is out of reach."""
    if ratio <= 0 or compute_s <= 0:
        raise ValueError(f"ratio and compute time must be positive, got {ratio}, {compute_s}")
    headroom = ratio * compute_s - fit.fixed_s
    if headroom <= 0:
        raise ValueError(
            f"comm/compute ratio {ratio:g} is unreachable: even an unlimited link leaves "
            f"M = {1e3 * fit.fixed_s:.1f} ms against C = {1e3 * compute_s:.1f} ms; the smallest "
            f"reachable ratio is about {smallest_ratio(fit, compute_s):.3g}")
    bandwidth = fit.per_mbit_s / headroom
    if not MIN_MBIT <= bandwidth <= MAX_MBIT:
        raise ValueError(
            f"comm/compute ratio {ratio:g} needs {bandwidth:.3g} Mbit/s, outside the "
            f"emulated link's range [{MIN_MBIT:g}, {MAX_MBIT:g}] Mbit/s")
    return bandwidth


def reshaped_bandwidth(fit: CommFit, bandwidth_mbit: float, compute_s: float, comm_s: float,
                       ratio: float) -> float:
    """The bandwidth that brings a drifted trial back to `ratio` (issue 39: C grew by two
    thirds over an hour while M stayed): the latest solo runs' C, and the fit's k rescaled
    through their measured M at `bandwidth_mbit` (m0 kept), so a drift of either is followed;
    the fit as it was where M is not above m0. Errors as choose_bandwidth's."""
    per_mbit_s = (comm_s - fit.fixed_s) * bandwidth_mbit
    latest = CommFit(fit.fixed_s, per_mbit_s) if per_mbit_s > 0 else fit
    return choose_bandwidth(latest, compute_s, ratio)


def second_bandwidth(first: CalibrationPoint, ratio: float) -> float:
    """Where to measure next: the first point's guess for B* assuming m0 = 0 (so the fit
    brackets the target), kept MIN_STEP..MAX_STEP away from the first bandwidth and in range."""
    b1 = first.bandwidth_mbit
    guess = b1 * first.comm_s / (ratio * first.compute_s)
    guess = min(max(guess, b1 / MAX_STEP), b1 * MAX_STEP)
    if b1 / MIN_STEP < guess < b1 * MIN_STEP:
        guess = b1 / MIN_STEP  # the first point is near the target: add a slower link
    return min(max(guess, MIN_MBIT), MAX_MBIT)


def next_bandwidth(points: Sequence[CalibrationPoint], ratio: float) -> float | None:
    """Where to measure next for `ratio`, or None when the points settle it: a fit with k > 0
    whose B* lies within MIN_STEP of the measured range (or an error that more points cannot
    change: the ratio is unreachable or B* is out of range)."""
    if len(points) == 1:
        return second_bandwidth(points[0], ratio)
    slowest = min(p.bandwidth_mbit for p in points)
    fastest = max(p.bandwidth_mbit for p in points)
    try:
        fit = fit_comm_model(points)
    except ValueError:  # noise swamped the bandwidth term: measure on a slower link
        slower = slowest / MIN_STEP
        return slower if slower >= MIN_MBIT else None
    try:
        target = choose_bandwidth(fit, compute_time(points), ratio)
    except ValueError:
        return None
    if slowest / MIN_STEP <= target <= fastest * MIN_STEP:
        return None
    return min(max(target, slowest / MAX_STEP), fastest * MAX_STEP)
