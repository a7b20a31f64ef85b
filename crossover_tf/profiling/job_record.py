"""A job's measured steps as the planner's JobStats record, from the strategy's own records.

experiments/train.py (its stats.json) and ProfileCallback (a job's profile) both turn
StepTimer's per-step records and the lease timeline into this one record, so a profile a
user's job writes means exactly what a profiled train.py run means.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from crossover_tf.profiling import phases
from crossover_tf_planner.clock_steps import stepped_mask
from crossover_tf_planner.job_stats import JobStats

if TYPE_CHECKING:
    from crossover_tf.strategy import CrossoverStrategy


def job_stats(strategy: "CrossoverStrategy", records: list[dict[str, float]], *, job: str,
              global_batch_size: int, warmup_steps: int, start_ns: int, end_ns: int,
              **fields: Any) -> JobStats:
    """Timing of the steps after ``warmup_steps`` (records: StepTimer.records, one per
    step run), and each phase's median from the lease timeline over the same steps (None
    without a crossover group). ``fields`` are the record's descriptive fields (model,
    dataset, priority, ...)."""
    timed = records[warmup_steps:]
    if not timed:
        raise ValueError(f"job {job!r}: no timed step ({len(records)} steps run, "
                         f"{warmup_steps} of them warm-up)")
    step_times = np.array([r["step_time_s"] for r in timed])
    wall_ends, mono_ends = ([r[key] for r in records] for key in ("end_ns", "mono_end_ns"))
    found: dict[str, Any] = {}
    lease_events, turn_events = strategy.lease_timeline(), strategy.link_turn_timeline()
    if lease_events is not None:
        events = np.asarray(lease_events, dtype=np.int64).reshape(-1, 4)
        phases_ns = phases.step_phases(events)
        found["phases_ns"] = phases_ns.tolist()
        found["lease_events_ns"] = events.tolist()
        measured = phases_ns[warmup_steps:len(records)]
        # A step the wall clock stepped over has phases of the wrong length (clock_steps.py).
        stepped = stepped_mask(wall_ends, mono_ends)[warmup_steps:warmup_steps + len(measured)]
        measured = measured[~stepped]
        for key, values in phases.phase_durations(measured).items():
            found[key] = float(np.median(values)) if len(values) else float("nan")
    if turn_events is not None:
        found["turn_events_ns"] = np.asarray(turn_events).tolist()
    return JobStats(
        job=job, rank=strategy.rank, size=strategy.size, device_key=strategy.device_key,
        global_batch_size=global_batch_size, steps=len(records), timed_steps=len(timed),
        step_time_s=float(np.median(step_times)),
        images_per_s=float(global_batch_size * len(timed) / step_times.sum()),
        timed_wall_s=float(step_times.sum()), start_ns=start_ns, end_ns=end_ns,
        cpu_s=float(np.mean([r["cpu_s"] for r in timed])),
        losses=[r["loss"] for r in records if "loss" in r],
        step_end_ns=wall_ends, step_end_mono_ns=mono_ends,
        lease=strategy.lease_stats(), turn=strategy.link_turn_stats(), **found, **fields)
