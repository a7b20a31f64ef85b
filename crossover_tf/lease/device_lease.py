"""DeviceLease: builds and runs the lease ops (ops/lease_ops.cc) for one (group, device)."""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import tensorflow as tf

from crossover_tf.lease import segments
from crossover_tf.lease.loader import load_library
from crossover_tf.lease.segments import validate_name

# Tags recorded with each acquisition in the lease timeline.
TAG_COMPUTE = 1
TAG_APPLY = 2
TAG_OTHER = 0


def default_device_key(local_rank: int = 0) -> str:
    """Names this process's device on its host: $CROSSOVER_DEVICE_KEY, else gpu<i> or cpu<i>.

    Two jobs share a lease only if they name the same key on the same host; launchers that
    emulate several hosts on one machine set CROSSOVER_DEVICE_KEY per emulated host.
    """
    key = os.environ.get("CROSSOVER_DEVICE_KEY")
    if key:
        return validate_name("device key", key, segments.DEVICE_KEY_MAX_LEN)
    kind = "gpu" if tf.config.list_physical_devices("GPU") else "cpu"
    return f"{kind}{local_rank}"


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
        return {k: float(v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_op_output(cls, values: Any) -> "LeaseStats":
        """Decodes CrossoverLeaseStats' float64 vector, whose order is STATS_FIELDS."""
        v = np.asarray(values)
        if v.shape != (len(STATS_FIELDS),):
            raise ValueError(f"lease stats op returned shape {v.shape}, expected "
                             f"({len(STATS_FIELDS)},) in the order {STATS_FIELDS}")
        return cls(*(_DECODE[f.type](x) for f, x in zip(dataclasses.fields(cls), v)))


# The stats op's output order: the field order of LeaseStats, its one definition.
STATS_FIELDS = tuple(f.name for f in dataclasses.fields(LeaseStats))
_DECODE = {"int": int, "float": float, "bool": bool}


class DeviceLease:
    """One (group, device) lease as seen by this process; the methods build or run TF ops.

    acquire/release take a nest of tensors and return it unchanged, so that they can be
    threaded through a graph: `grads = lease.release(grads)` runs after grads exist.
    """

    def __init__(self, group: str, device_key: str, timeout_s: float = 600.0):
        self.group = validate_name("group", group, segments.GROUP_MAX_LEN)
        self.device_key = validate_name("device key", device_key, segments.DEVICE_KEY_MAX_LEN)
        if not timeout_s > 0:
            raise ValueError(f"lease timeout must be positive, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self._ops = load_library()

    def __repr__(self) -> str:
        return f"DeviceLease(group={self.group!r}, device_key={self.device_key!r})"

    def acquire(self, tensors: Any = (), tag: int = TAG_OTHER) -> Any:
        return self._pass_through(self._ops.crossover_acquire_lease, tensors,
                                  timeout_seconds=self.timeout_s, tag=tag)

    def release(self, tensors: Any = ()) -> Any:
        return self._pass_through(self._ops.crossover_yield_lease, tensors)

    def _pass_through(self, op: Any, tensors: Any, **attrs: Any) -> Any:
        flat = tf.nest.flatten(tensors)
        out = op(flat, group=self.group, device_key=self.device_key, **attrs)
        if not flat:  # graph mode returns the Operation for an op without outputs
            return tensors
        return tf.nest.pack_sequence_as(tensors, out)

    def stats(self) -> LeaseStats:
        return LeaseStats.from_op_output(
            self._ops.crossover_lease_stats(group=self.group, device_key=self.device_key))

    def timeline(self) -> np.ndarray:
        """[n, 4] int64: request_ns, acquired_ns, released_ns (0 = held), tag; wall clock."""
        return np.asarray(
            self._ops.crossover_lease_timeline(group=self.group, device_key=self.device_key))
