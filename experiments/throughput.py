"""Throughput arithmetic for compare.py, on the stats.json files experiments/train.py writes.

Kept apart from the launching code so it can be tested on hand-made stats.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from crossover_tf_planner.job_stats import JobStats


def sequential_aggregate(jobs: Mapping[str, JobStats]) -> float:
    """A then B on the same hosts: all timed images over the sum of their timed walls."""
    images = sum(j.timed_images for j in jobs.values())
    return images / sum(j.timed_wall_s for j in jobs.values())


class WindowTooShort(ValueError):
    """A concurrent scenario whose jobs overlapped too little to measure: its numbers would be a
    few steps' noise (a 5 ms window once gave crossover/sequential 1.39), so it is refused."""


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


def concurrent_aggregate(stats: Mapping[str, JobStats], warmup_steps: int | Mapping[str, int],
                         guard: WindowGuard | None = WindowGuard(),
                         share_exempt: Sequence[str] = ()
                         ) -> tuple[float, dict[str, float], float]:
    """Steady state of jobs run together: images per second summed over jobs, counting only
    steps completed while *all* jobs were past warm-up and still running (a job that starts
    late or finishes early would otherwise be credited with time it ran alone). warmup_steps
    may be given per job. `guard` (None: off) refuses a window too short to mean anything
    with WindowTooShort; `share_exempt` jobs need only its step count.

    Returns (aggregate images/s, per-job images/s, window seconds).
    """
    ends = {name: np.asarray(s.step_end_ns, dtype=np.int64) for name, s in stats.items()}
    warmup = (warmup_steps if isinstance(warmup_steps, Mapping)
              else {name: warmup_steps for name in stats})
    start = max(e[warmup[name]] for name, e in ends.items())
    stop = min(e[-1] for e in ends.values())
    if stop <= start:
        raise WindowTooShort("jobs did not run concurrently past warm-up; increase --steps")
    window_s = (stop - start) / 1e9
    steps_in = {name: int(np.count_nonzero((e > start) & (e <= stop))) for name, e in ends.items()}
    if guard is not None:
        # A job's timed run: from the end of its last warm-up step (its first step's end
        # without warm-up) to its last step's end.
        timed_s = {name: (e[-1] - e[max(warmup[name] - 1, 0)]) / 1e9 for name, e in ends.items()}
        guard.check(window_s, steps_in, timed_s, share_exempt)
    per_job = {name: n * stats[name].global_batch_size / window_s
               for name, n in steps_in.items()}
    return float(sum(per_job.values())), per_job, window_s


def ideal_crossover_ratio(jobs: Sequence[JobStats]) -> float:
    """Crossover over sequential when every job's device time C (compute + apply) hides under
    the others' communication M. Two jobs alternate strictly:
    (C_A+M_A + C_B+M_B) / (max(C_A, M_B) + max(C_B, M_A)), i.e. (C+M)/max(C,M) for equal jobs.
    N jobs take FIFO turns: a round is bounded by the device (sum of C), the shared links (sum
    of M) and each job's own step (C+M), so sum(C+M) / max(sum C, sum M, max(C+M))."""
    if len(jobs) < 2:
        raise ValueError(f"the ideal crossover ratio needs >= 2 jobs, got {len(jobs)}")
    total = sum(j.device_s + j.comm_s for j in jobs)
    if len(jobs) == 2:
        a, b = jobs
        return total / (max(a.device_s, b.comm_s) + max(b.device_s, a.comm_s))
    return total / max(sum(j.device_s for j in jobs), sum(j.comm_s for j in jobs),
                       max(j.device_s + j.comm_s for j in jobs))
