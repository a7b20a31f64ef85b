"""What the priority scenario is judged on, from the jobs' saved lease events.

A primary next to secondaries should run almost as if alone (its throughput against solo), the
secondaries should still get the device's gaps (their throughput against naive co-location),
and the primary should never wait longer than one secondary micro-batch's compute plus a
hand-off (its worst wait against the secondaries' micro-batch holds). Pure numpy on JobStats.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from crossover_tf_planner import registry as r
from crossover_tf_planner.job_stats import TAG_COMPUTE, JobStats


def timed_events(stats: JobStats, warmup_steps: int) -> np.ndarray:
    """[n, 4] lease events (request, acquired, released, tag) requested after warm-up."""
    events = np.asarray(stats.lease_events_ns, dtype=np.int64).reshape(-1, 4)
    if not len(stats.step_end_ns) > warmup_steps:
        raise ValueError(f"job {stats.job}: no steps after the {warmup_steps} warm-up steps")
    start = stats.step_end_ns[warmup_steps - 1] if warmup_steps else stats.start_ns
    return events[events[:, 0] >= start]


def waits_s(events: np.ndarray) -> np.ndarray:
    """Seconds from asking for the lease to getting it, per event."""
    return (events[:, 1] - events[:, 0]) / 1e9


def compute_holds_s(events: np.ndarray) -> np.ndarray:
    """Seconds each compute (forward/backward: one micro-batch) hold lasted."""
    compute = events[(events[:, 3] == TAG_COMPUTE) & (events[:, 2] > 0)]
    return (compute[:, 2] - compute[:, 1]) / 1e9


def priority_ratios(priority: Mapping[str, JobStats], solo: Mapping[str, JobStats],
                    priority_rates: Mapping[str, float], naive_rates: Mapping[str, float] | None,
                    warmup_steps: int) -> dict[str, float]:
    """The primary's throughput over its solo run, the secondaries' over naive co-location
    (when naive ran), the primary's worst and 99th-percentile wait, and the secondaries'
    median micro-batch compute hold, with worst wait / micro-batch compute."""
    primaries = [job for job, s in priority.items() if s.priority == "primary"]
    secondaries = [job for job, s in priority.items() if s.priority == "secondary"]
    if len(primaries) != 1 or not secondaries:
        raise ValueError(f"the priority scenario needs one primary and >= 1 secondary, got "
                         f"{ {job: s.priority for job, s in priority.items()} }")
    (primary,) = primaries
    waits = waits_s(timed_events(priority[primary], warmup_steps))
    holds = np.concatenate([compute_holds_s(timed_events(priority[job], warmup_steps))
                            for job in secondaries])
    if not len(waits) or not len(holds):
        raise ValueError("the priority scenario left no timed lease events to judge")
    secondary_rate = sum(priority_rates[j] for j in secondaries)
    ratios = {
        r.PRIMARY_OVER_SOLO.key: priority_rates[primary] / solo[primary].images_per_s,
        r.SECONDARY_OVER_SOLO.key: secondary_rate / sum(solo[j].images_per_s
                                                        for j in secondaries),
        r.PRIMARY_MAX_WAIT.key: float(waits.max()),
        r.PRIMARY_P99_WAIT.key: float(np.percentile(waits, 99)),
        r.SECONDARY_MICRO_BATCH.key: float(np.median(holds)),
    }
    ratios[r.PRIMARY_WAIT_OVER_MICRO_BATCH.key] = float(waits.max()) / float(np.median(holds))
    if naive_rates is not None:
        ratios[r.SECONDARY_OVER_NAIVE.key] = secondary_rate / sum(naive_rates[j]
                                                                  for j in secondaries)
        ratios[r.PRIMARY_OVER_NAIVE.key] = priority_rates[primary] / naive_rates[primary]
    return ratios
