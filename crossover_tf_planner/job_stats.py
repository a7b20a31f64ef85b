"""What one training job measured: the record experiments/train.py writes as stats.json.

The comparison (experiments/compare.py, throughput.py) and the planner (profile, validate) all
read this one typed record, so a field means the same everywhere. Plain Python, no TensorFlow.

Time per step is split into distinct names: ``compute_s`` is the lease hold for forward and
backward only (in micro-batches: from the first one's acquire to the last one's release),
``apply_s`` the hold for the optimizer update, and ``device_s`` their sum (all the time a step
needs the device).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from crossover_tf_planner import json_io


# The tag column of lease_events_ns: crossover_tf.lease's TAG_OTHER, TAG_COMPUTE, TAG_APPLY
# (tests check they agree; repeated here so that readers of saved stats need no TensorFlow).
LEASE_TAGS = {0: "other", 1: "compute", 2: "apply"}
TAG_COMPUTE = 1


@dataclasses.dataclass(frozen=True)
class JobStats(json_io.JsonRecord):
    """One job's measured steps (rank 0's view; every rank computes the same record).

    The phase medians (compute_s, comm_s, wait_s, apply_s) come from the lease timeline over
    the timed steps; they are None for a job trained without a crossover group.
    """

    record_kind = "job stats"
    name_field = "job"

    job: str
    global_batch_size: int
    steps: int  # all steps run, warm-up included
    timed_steps: int  # steps after warm-up
    step_time_s: float  # median wall time of a timed step
    images_per_s: float  # timed images over the timed steps' wall time
    timed_wall_s: float
    group: str = ""
    rank: int = 0
    size: int = 1
    device_key: str = ""
    priority: str = "normal"  # lease priority class (normal, primary, secondary)
    micro_batches: int = 1
    model: str = ""
    dataset: str = ""
    jit_compile: bool = False
    start_ns: int = 0
    end_ns: int = 0
    losses: list[float] = dataclasses.field(default_factory=list)
    step_end_ns: list[int] = dataclasses.field(default_factory=list)  # wall clock
    # Each step's end on the monotonic clock: the steps' own lengths, whatever the wall clock
    # did (clock_steps.py; empty in records written before 2026-12-07).
    step_end_mono_ns: list[int] = dataclasses.field(default_factory=list)
    lease: dict[str, float] = dataclasses.field(default_factory=dict)
    turn: dict[str, float] = dataclasses.field(default_factory=dict)  # link turn stats, if any
    # Every link turn: [request, start, done, skipped] wall-clock ns (the allreduce in turn).
    turn_events_ns: list[list[int]] = dataclasses.field(default_factory=list)
    phases_ns: list[list[int]] = dataclasses.field(default_factory=list)
    # Every lease event: [request, acquired, released, tag] wall-clock ns (all micro-batches).
    lease_events_ns: list[list[int]] = dataclasses.field(default_factory=list)
    compute_s: float | None = None  # lease held for forward + backward
    comm_s: float | None = None  # from yielding after compute to asking again (allreduce)
    wait_s: float | None = None  # queued behind the peer before the apply
    apply_s: float | None = None  # lease held for the optimizer update
    peak_device_memory_mb: float | None = None  # GPU only: TensorFlow's peak allocation
    cpu_s: float | None = None  # mean CPU seconds per timed step, the whole process

    def to_dict(self) -> dict[str, Any]:
        """The record; without step_end_mono_ns where it is empty, so a record written before
        the field existed reads back and writes out the same."""
        data = super().to_dict()
        if not data["step_end_mono_ns"]:
            del data["step_end_mono_ns"]
        return data

    @property
    def device_s(self) -> float | None:
        """Time per step on the device: compute plus apply (None without a lease timeline)."""
        if self.compute_s is None or self.apply_s is None:
            return None
        return self.compute_s + self.apply_s

    @property
    def timed_images(self) -> int:
        return self.global_batch_size * self.timed_steps
