"""Per-step phases recovered from a lease timeline (CrossoverLeaseTimeline events).

One crossover step leaves two lease events: the compute hold (tag 1) and the apply hold
(tag 2). Between releasing the first and requesting the second, the job is in its allreduce;
between requesting and getting the second, it waits for the peer. Everything here is plain
numpy so the experiments and planner can use it on saved JSON.
"""
from __future__ import annotations

import numpy as np

from crossover_tf.lease import TAG_APPLY, TAG_COMPUTE

PHASE_COLUMNS = ("compute_start", "compute_end", "comm_end", "apply_start", "apply_end")


def step_phases(events: np.ndarray | list) -> np.ndarray:
    """[steps, 5] wall-clock ns: compute_start, compute_end (= comm start), comm_end (apply
    requested), apply_start (apply acquired), apply_end. Only complete steps are returned.

    A job in micro-batches (a secondary in priority mode) holds the device once per
    micro-batch before its one allreduce: its compute phase runs from the first micro-batch's
    acquire to the last one's yield (holds of a primary between them included), not just
    the last micro-batch."""
    events = np.asarray(events, dtype=np.int64).reshape(-1, 4)
    rows, first_acquired, last_released = [], None, None
    for request, acquired, released, tag in events:
        if tag == TAG_COMPUTE and released:
            first_acquired = acquired if first_acquired is None else first_acquired
            last_released = released
            continue
        if tag == TAG_APPLY and released and first_acquired is not None:
            rows.append((first_acquired, last_released, request, acquired, released))
        first_acquired = last_released = None
    return np.asarray(rows, dtype=np.int64).reshape(-1, len(PHASE_COLUMNS))


def phase_durations(phases: np.ndarray) -> dict[str, np.ndarray]:
    """Seconds per step: compute (lease held for forward/backward), comm (allreduce), apply
    (lease held for the update), wait_for_apply (queued behind the peer after comm)."""
    p = phases.astype(np.float64) / 1e9
    return {"compute_s": p[:, 1] - p[:, 0], "comm_s": p[:, 2] - p[:, 1],
            "wait_s": p[:, 3] - p[:, 2], "apply_s": p[:, 4] - p[:, 3]}
