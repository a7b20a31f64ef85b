"""Throughput arithmetic for compare.py, on the stats.json files experiments/train.py writes.

Kept apart from the launching code so it can be tested on hand-made stats.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from crossover_tf_planner import clock_steps
from crossover_tf_planner.job_stats import JobStats


def sequential_aggregate(jobs: Mapping[str, JobStats]) -> float:
    """A then B on the same hosts: all timed images over the sum of their timed walls."""
    images = sum(j.timed_images for j in jobs.values())
    return images / sum(j.timed_wall_s for j in jobs.values())


class WindowUnmeasurable(ValueError):
    """A concurrent scenario whose window cannot be measured: it is refused, left out of the
    table and every ratio, with the reason (comparison/summary.py)."""


class WindowTooShort(WindowUnmeasurable):
    """A concurrent scenario whose jobs overlapped too little to measure: its numbers would be a
    few steps' noise (such a window once gave a crossover/sequential ratio above what any
    policy can reach), so it is refused."""


class ClockStepped(WindowUnmeasurable):
    """A concurrent scenario during whose window the wall clock stepped: the window's length,
    read off the wall clock as the jobs' step ends are, is wrong by the step
    (crossover_tf_planner/clock_steps.py)."""


@dataclasses.dataclass(frozen=True)
class WindowGuard:
    """What a concurrent window must hold to mean something: every job completes at least
    `min_steps` steps inside it, and it covers at least `min_share` of each job's timed run
    (a job exempt from the share, such as a secondary that runs on alone after the primary
    ends by design, still needs its steps)."""
    min_steps: int = 5
    min_share: float = 0.5

    def check(self, window_s: float, steps_in: Mapping[str, int],
              timed_s: Mapping[str, float], share_exempt: Sequence[str] = ()) -> None:
        """Raises WindowTooShort saying what fell short and what to change."""
        problems = [f"job {job} completed {n} step(s) in it (need >= {self.min_steps})"
                    for job, n in steps_in.items() if n < self.min_steps]
        problems += [f"it covers {window_s / timed_s[job]:.0%} of job {job}'s timed run "
                     f"(need >= {self.min_share:.0%})"
                     for job in steps_in if job not in share_exempt and timed_s[job] > 0
                     and window_s < self.min_share * timed_s[job]]
        if problems:
            raise WindowTooShort(
                f"the jobs' concurrent window was {1e3 * window_s:.1f} ms: "
                f"{'; '.join(problems)}. Their timed phases barely overlapped: run more "
                "--steps, fewer --warmup_steps, or keep the start barrier on (train.py's "
                "--start_barrier, which compare.py sets)")


def _window(stats: Mapping[str, JobStats], warmup_steps: int | Mapping[str, int]
            ) -> tuple[dict[str, np.ndarray], Mapping[str, int], int, int]:
    """Each job's step ends (ns), its warm-up steps, and the concurrent window's edges: from
    the last job's end of warm-up to the first job's last step end (one definition for the
    rates and for the step durations a bootstrap resamples)."""
    ends = {name: np.asarray(s.step_end_ns, dtype=np.int64) for name, s in stats.items()}
    warmup = (warmup_steps if isinstance(warmup_steps, Mapping)
              else {name: warmup_steps for name in stats})
    start = max(int(e[warmup[name]]) for name, e in ends.items())
    stop = min(int(e[-1]) for e in ends.values())
    return ends, warmup, start, stop


def concurrent_aggregate(stats: Mapping[str, JobStats], warmup_steps: int | Mapping[str, int],
                         guard: WindowGuard | None = WindowGuard(),
                         share_exempt: Sequence[str] = ()
                         ) -> tuple[float, dict[str, float], float]:
    """Steady state of jobs run together: images per second summed over jobs, counting only
    steps completed while *all* jobs were past warm-up and still running (a job that starts
    late or finishes early would otherwise be credited with time it ran alone); the steps
    the window's edges cut count by their fraction inside it (fractional_steps), while the
    guard counts whole steps. warmup_steps
    may be given per job. `guard` (None: off) refuses a window too short to mean anything
    with WindowTooShort; `share_exempt` jobs need only its step count.

    Returns (aggregate images/s, per-job images/s, window seconds).
    """
    ends, warmup, start, stop = _window(stats, warmup_steps)
    if stop <= start:
        raise WindowTooShort("jobs did not run concurrently past warm-up; increase --steps")
    _refuse_clock_steps(stats, ends, start, stop)
    window_s = (stop - start) / 1e9
    steps_in = {name: int(np.count_nonzero((e > start) & (e <= stop))) for name, e in ends.items()}
    if guard is not None:
        # A job's timed run: from the end of its last warm-up step (its first step's end
        # without warm-up) to its last step's end.
        timed_s = {name: (e[-1] - e[max(warmup[name] - 1, 0)]) / 1e9 for name, e in ends.items()}
        guard.check(window_s, steps_in, timed_s, share_exempt)
    per_job = {name: fractional_steps(e, start, stop) * stats[name].global_batch_size / window_s
               for name, e in ends.items()}
    return float(sum(per_job.values())), per_job, window_s


def _refuse_clock_steps(stats: Mapping[str, JobStats], ends: Mapping[str, np.ndarray],
                        start: int, stop: int) -> None:
    """Raises ClockStepped where a job's step inside the window (start, stop] was one the
    wall clock stepped over."""
    for name, e in ends.items():
        inside = (e > start) & (e <= stop) & clock_steps.stepped_steps(stats[name])
        if inside.any():
            step = int(np.flatnonzero(inside)[0])
            raise ClockStepped(
                f"the wall clock stepped during job {name}'s step {step}, inside the jobs' "
                "concurrent window: the window's length, read off the wall clock, is wrong "
                "by the step (a time daemon setting the clock; run again)")


def fractional_steps(ends_ns: np.ndarray, start: int, stop: int) -> float:
    """Steps a job made between two instants, counting the steps cut by the window's edges by
    the fraction of them inside it (progress within a step interpolated between its start and
    end, i.e. the previous step's end and its own). With a few tens of whole steps per window
    one step is a share of a job's rate as large as the effects compared; whole steps would
    add that much quantisation noise, depending only on where the edges fall."""
    progress = np.interp([start, stop], ends_ns, np.arange(len(ends_ns), dtype=float))
    return float(progress[1] - progress[0])


def window_step_durations(stats: Mapping[str, JobStats], warmup_steps: int | Mapping[str, int]
                          ) -> dict[str, list[float]]:
    """Per job, the durations (s) of the steps that end inside the concurrent window: what a
    bootstrap resamples to tell how far the window's rates could move by chance."""
    ends, _, start, stop = _window(stats, warmup_steps)
    return {name: _known(clock_steps.step_lengths_s(stats[name])[(e[1:] > start) & (e[1:] <= stop)])
            for name, e in ends.items()}


def timed_step_durations(stats: JobStats, warmup_steps: int) -> list[float]:
    """Durations (s) of a job's timed steps (those after warm-up), e.g. in a sequential run."""
    return _known(clock_steps.step_lengths_s(stats)[max(warmup_steps - 1, 0):])


def _known(lengths_s: np.ndarray) -> list[float]:
    """Step lengths without those a clock step made unknown (clock_steps.step_lengths_s)."""
    return lengths_s[~np.isnan(lengths_s)].tolist()

