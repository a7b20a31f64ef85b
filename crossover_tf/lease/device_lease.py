"""DeviceLease: builds and runs the lease ops (ops/tf/lease_ops.cc) for one (group, device)."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
from typing import Any

import numpy as np
import tensorflow as tf

from crossover_tf.lease import group_join, segments
from crossover_tf.lease.loader import load_library
from crossover_tf.lease.membership import Member, snapshot_from_op_output, validate_job
from crossover_tf.lease.segments import validate_name

# Tags recorded with each acquisition in the lease timeline.
TAG_COMPUTE = 1
TAG_APPLY = 2
TAG_OTHER = 0

# Priority classes (the C++ core's LeasePriority): waiters queue by class, FIFO within one.
PRIORITIES = {"secondary": 0, "normal": 1, "primary": 2}

# The C++ core's bound (kMaxTimeoutS): a finite timeout turns a stuck peer into an error.
MAX_TIMEOUT_S = 30 * 24 * 3600.0
# The C++ core's bound on a yield's reservation (kMaxReserveS).
MAX_RESERVE_S = 10.0


def validate_priority(priority: str) -> str:
    """Checks a priority class name early (the op checks the number it becomes)."""
    if priority not in PRIORITIES:
        raise ValueError(f"crossover lease priority must be one of {sorted(PRIORITIES)}, "
                         f"got {priority!r}")
    return priority


def validate_reserve(reserve_s: float) -> float:
    """Checks a yield's reservation early, with the same rule as the C++ side."""
    if not (isinstance(reserve_s, (int, float)) and math.isfinite(reserve_s)
            and 0 <= reserve_s <= MAX_RESERVE_S):
        raise ValueError(f"crossover lease reservation must be in [0, {MAX_RESERVE_S:g}] s, "
                         f"got {reserve_s!r}")
    return float(reserve_s)


def validate_timeout(timeout_s: float) -> float:
    """Checks an acquire timeout early, with the same rule as the C++ side."""
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s)
            and 0 < timeout_s <= MAX_TIMEOUT_S):
        raise ValueError(f"crossover lease timeout must be a number of seconds in "
                         f"(0, {MAX_TIMEOUT_S:.0f}], got {timeout_s!r} (a finite bound turns a "
                         "stuck peer into an error instead of a hang)")
    return float(timeout_s)


@dataclasses.dataclass(frozen=True)
class LeaseStats:
    """This process's cumulative use of one lease."""
    acquires: int
    handoffs: int
    contended: int
    recoveries: int
    wait_s: float
    hold_s: float
    max_wait_s: float
    max_hold_s: float
    held: bool

    def as_dict(self) -> dict[str, float]:
        return fields_as_floats(self)

    @classmethod
    def from_op_output(cls, values: Any, names: Any) -> "LeaseStats":
        return decode_named_values(cls, values, names)


def decode_named_values(cls: type, values: Any, names: Any) -> Any:
    """Builds dataclass cls from a stats op's (values, names): the C++ core names each value,
    so the order is defined once, there (kLeaseStatsFields, kLinkTurnStatsFields)."""
    return decode_with(cls, named_decoders(cls, names), values)


def named_decoders(cls: type, names: Any) -> list[tuple[str, Any]]:
    """(field, decoder) in the op's order, checked against cls's fields. A reader that keeps
    them decodes each later read of the same op with decode_with alone: a per-step timer reads
    the stats every step, and decoding the names every read made it 34 us, 16 once checked
    (issue 52)."""
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in np.asarray(names)]
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    if sorted(names) != sorted(fields):
        raise RuntimeError(f"lease op library reports stats {names}, this module expects "
                           f"{list(fields)}: rebuild the op library (make -C ops)")
    return [(n, _DECODE[fields[n]]) for n in names]


def decode_with(cls: type, decoders: list[tuple[str, Any]], values: Any) -> Any:
    """cls from one read's values, in the order named_decoders checked."""
    return cls(**{n: decode(v) for (n, decode), v in zip(decoders, np.asarray(values))})


def fields_as_floats(record: Any) -> dict[str, float]:
    """A flat stats dataclass as {field: float} (dataclasses.asdict deep-copies: 9 us a read)."""
    return {name: float(getattr(record, name)) for name in _field_names(type(record))}


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


_DECODE = {"int": int, "float": float, "bool": bool}


class DeviceLease:
    """One (group, device) lease as seen by this process; the methods build or run TF ops.

    acquire/yield_device take a nest of tensors and return it unchanged, so that they can be
    threaded through a graph: `grads = lease.yield_device(grads)` runs after grads exist.

    lease_dir: where the segment file lives (segments.resolve_lease_dir: None is
    $CROSSOVER_LEASE_DIR, else /dev/shm). shared_group: jobs of several users share it (the
    file is 0660, of the directory's group; None: $CROSSOVER_LEASE_SHARED_GROUP=1, else off).
    job: this process's label on the lease; ""/None is "<host>:<pid>". Any op on the lease
    makes this process a member (register() does it without touching the device).
    """

    def __init__(self, group: str, device_key: str, timeout_s: float = 600.0,
                 priority: str = "normal", *, lease_dir: str | os.PathLike | None = None,
                 shared_group: bool | None = None, job: str | None = ""):
        self.group = validate_name("group", group, segments.GROUP_MAX_LEN)
        self.device_key = validate_name("device key", device_key, segments.DEVICE_KEY_MAX_LEN)
        self.timeout_s = validate_timeout(timeout_s)
        self.priority = validate_priority(priority)
        self.lease_dir = segments.resolve_lease_dir(lease_dir)
        self.shared_group = segments.resolve_shared_group(shared_group)
        self.job = validate_job(job)
        self.path = segments.segment_path(self.group, self.device_key, self.lease_dir)
        self._ops = load_library()
        self._stats_decoders: list[tuple[str, Any]] | None = None  # stats(): checked once

    def __repr__(self) -> str:
        return (f"DeviceLease(group={self.group!r}, device_key={self.device_key!r}, "
                f"priority={self.priority!r}, path={str(self.path)!r})")

    @property
    def names(self) -> dict[str, Any]:
        """The attrs that name this lease's segment, and this process on it, in every lease op
        (and link turn op)."""
        return {"group": self.group, "device_key": self.device_key,
                "lease_dir": str(self.lease_dir), "shared_group": self.shared_group,
                "job": self.job}

    def register(self) -> None:
        """Makes this process a member now (idempotent); never touches the device."""
        self._ops.crossover_lease_register(**self.names)

    def members(self) -> list[Member]:
        """The live members, read from the segment this process has mapped (it becomes a member
        first), never from a file looked up again by name: raises tf.errors.FailedPreconditionError
        if the name no longer refers to that segment (renamed or replaced while in use)."""
        return list(snapshot_from_op_output(
            *self._ops.crossover_lease_members(**self.names)).members)

    def wait_for_jobs(self, jobs: int, timeout_s: float) -> list[Member]:
        """Registers, then waits (polling, at most timeout_s) until `jobs` distinct job labels
        are live on this lease; returns the members or raises GroupIncomplete, whose message
        names the file, who was there and what to set (group_join says why)."""
        group_join.validate_jobs(jobs)
        self.register()
        return group_join.wait_for_jobs(self.members, self.path, jobs, timeout_s)

    def acquire(self, tensors: Any = (), tag: int = TAG_OTHER) -> Any:
        return pass_through(self._ops.crossover_acquire_lease, tensors, **self.names,
                            timeout_seconds=self.timeout_s, tag=tag,
                            priority=PRIORITIES[self.priority])

    def yield_device(self, tensors: Any = (), reserve_s: float = 0.0) -> Any:
        """Yields the device. reserve_s > 0 keeps lower priority classes out for that long
        (a primary at the end of its step: a secondary must not start work it would then be
        waited for); the reserver itself comes straight back."""
        # Nothing to wait for: the host kernel, not a GPU one that would drain a stream.
        placement = (contextlib.nullcontext() if tf.nest.flatten(tensors)
                     else tf.device("/CPU:0"))
        with placement:
            return pass_through(self._ops.crossover_yield_lease, tensors, **self.names,
                                reserve_seconds=reserve_s)

    def stats(self) -> LeaseStats:
        values, names = self._ops.crossover_lease_stats(**self.names)
        if self._stats_decoders is None:
            self._stats_decoders = named_decoders(LeaseStats, names)
        return decode_with(LeaseStats, self._stats_decoders, values)

    def timeline(self) -> np.ndarray:
        """[n, 4] int64: request_ns, acquired_ns, yielded_ns (0 = held), tag; wall clock."""
        return np.asarray(self._ops.crossover_lease_timeline(**self.names))


def pass_through(op: Any, tensors: Any, **attrs: Any) -> Any:
    """Runs a lease op that passes a nest of tensors through unchanged (so that it can be
    threaded through a graph), and returns the nest."""
    flat = tf.nest.flatten(tensors)
    out = op(flat, **attrs)
    if not flat:  # graph mode returns the Operation for an op without outputs
        return tensors
    return tf.nest.pack_sequence_as(tensors, out)
