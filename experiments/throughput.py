"""Throughput arithmetic for compare.py, on the stats.json files experiments/train.py writes.

Kept apart from the launching code so it can be tested on hand-made stats.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from crossover_tf_planner.job_stats import JobStats


def sequential_aggregate(jobs: Mapping[str, JobStats]) -> float:
    """A then B on the same hosts: all timed images over the sum of their timed walls."""
    images = sum(j.timed_images for j in jobs.values())
    return images / sum(j.timed_wall_s for j in jobs.values())


def concurrent_aggregate(stats: Mapping[str, JobStats], warmup_steps: int | Mapping[str, int]
                         ) -> tuple[float, dict[str, float], float]:
    """Steady state of jobs run together: images per second summed over jobs, counting only
    steps completed while *all* jobs were past warm-up and still running (a job that starts
    late or finishes early would otherwise be credited with time it ran alone). warmup_steps
    may be given per job.

    Returns (aggregate images/s, per-job images/s, window seconds).
    """
    ends = {name: np.asarray(s.step_end_ns, dtype=np.int64) for name, s in stats.items()}
    warmup = (warmup_steps if isinstance(warmup_steps, Mapping)
              else {name: warmup_steps for name in stats})
    start = max(e[warmup[name]] for name, e in ends.items())
    stop = min(e[-1] for e in ends.values())
    if stop <= start:
        raise ValueError("jobs did not run concurrently past warm-up; increase --steps")
    window_s = (stop - start) / 1e9
    per_job = {}
    for name, e in ends.items():
        done = int(np.count_nonzero((e > start) & (e <= stop)))
        per_job[name] = done * stats[name].global_batch_size / window_s
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
