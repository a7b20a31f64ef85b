"""Steps over which the wall clock stepped, so that no duration is taken across a clock step.

A job's timelines are in the wall clock (CLOCK_REALTIME: the lease's events, each step's end),
so that two processes' events line up. But the wall clock is set, not only counted: in a
fresh-clone main job (2026-12-07, trial 0, job A's solo run) it moved 22.21 s more than the
monotonic clock over one step, and that step's compute phase read 23.7 s; the ideal, a mean over
the phases, fell from about 1.9 to 1.063 and the trial's crossed ratios were flagged as above it.
Steps whose length differs between the two clocks are found here, and every duration read off
the wall clock leaves them out.

Records since 2026-12-07 carry each step's monotonic end (JobStats.step_end_mono_ns): the
check is exact, and a step's own length is taken from the monotonic clock. Older records carry
only the timed steps' monotonic total (timed_wall_s): where the wall clock spanned more or less
than that, the timed steps whose wall length strays from the median, in that direction, by at
least half the difference are the stepped ones (the 2026-12-07 record: one step, 23.8 s long
against the 22.2 s difference).

Tolerance: 5 ms or 2% of the step, whichever is more. A slewing time daemon moves the wall
clock against the monotonic one by at most 0.05% (ntpd) to a few per cent (chrony catching up
after a start-up step; the same record's other runs were off by 0.5%): slewing stays within
it and leaves its small error; a step of the clock does not.
"""
from __future__ import annotations

import numpy as np

from crossover_tf_planner.job_stats import JobStats

TOLERANCE_S = 0.005
TOLERANCE_SHARE = 0.02


def _beyond(difference_s: np.ndarray, length_s: np.ndarray) -> np.ndarray:
    return np.abs(difference_s) > np.maximum(TOLERANCE_S, TOLERANCE_SHARE * np.abs(length_s))


def stepped_mask(wall_ends_ns: np.ndarray, mono_ends_ns: np.ndarray) -> np.ndarray:
    """Per step, whether the wall clock moved unlike the monotonic one over it (from the
    previous step's end to its own); step 0, whose start is not recorded, is taken as not."""
    wall = np.diff(np.asarray(wall_ends_ns, dtype=np.int64)) / 1e9
    mono = np.diff(np.asarray(mono_ends_ns, dtype=np.int64)) / 1e9
    return np.concatenate([[False], _beyond(wall - mono, mono)])


def stepped_steps(stats: JobStats) -> np.ndarray:
    """Per step of the record (length stats.steps), whether the wall clock stepped over it:
    exactly where the record has monotonic ends, from the timed steps' total otherwise."""
    ends = np.asarray(stats.step_end_ns, dtype=np.int64)
    if len(stats.step_end_mono_ns) == len(ends):
        return stepped_mask(ends, np.asarray(stats.step_end_mono_ns, dtype=np.int64))
    mask = np.zeros(len(ends), dtype=bool)
    first = stats.steps - stats.timed_steps
    if first < 1 or len(ends) != stats.steps or stats.timed_steps < 1:
        return mask  # no end before the first timed step: its length is unknown
    wall = np.diff(ends[first - 1:]) / 1e9  # the timed steps' wall lengths
    difference = float(wall.sum()) - stats.timed_wall_s
    if not _beyond(np.array([difference]), np.array([stats.timed_wall_s]))[0]:
        return mask  # within what slewing moves it over the whole timed run
    excess = (wall - np.median(wall)) * np.sign(difference)
    mask[first:] = excess >= abs(difference) / 2
    return mask


def step_lengths_s(stats: JobStats) -> np.ndarray:
    """Each step's length from the previous step's end (index j: step j + 1), in seconds: from
    the monotonic ends where the record has them; from the wall clock's otherwise, NaN for the
    steps it stepped over (their length is unknown)."""
    ends = np.asarray(stats.step_end_ns, dtype=np.int64)
    if len(stats.step_end_mono_ns) == len(ends):
        return np.diff(np.asarray(stats.step_end_mono_ns, dtype=np.int64)) / 1e9
    lengths = np.diff(ends) / 1e9
    lengths[stepped_steps(stats)[1:]] = np.nan
    return lengths
