"""Thin Python loader and wrappers for the device-lease ops (ops/lease_ops.cc).

The shared library is loaded on first use, as Horovod and tensorflow/custom-op do, so importing
crossover_tf stays cheap and a missing build gives a clear message instead of an ImportError
deep in TensorFlow.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import pathlib
from typing import Any

import numpy as np
import tensorflow as tf

from crossover_tf.ops import segments
from crossover_tf.ops.segments import validate_name

LIBRARY_NAME = "_lease_ops.so"
# Where the library may be: $CROSSOVER_LEASE_OPS (explicit), beside this file (pip build,
# ops/Makefile), or ops/ at the repository root (Bazel runfiles of //ops:_lease_ops.so).
LIBRARY_CANDIDATES = (pathlib.Path(__file__).with_name(LIBRARY_NAME),
                      pathlib.Path(__file__).resolve().parents[2] / "ops" / LIBRARY_NAME)

# Tags recorded with each acquisition in the lease timeline.
TAG_COMPUTE = 1
TAG_APPLY = 2
TAG_OTHER = 0

# The C++ core's bound (kMaxTimeoutS): a finite timeout turns a stuck peer into an error.
MAX_TIMEOUT_S = 30 * 24 * 3600.0


def validate_timeout(timeout_s: float) -> float:
    """Checks an acquire timeout early, with the same rule as the C++ side."""
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s)
            and 0 < timeout_s <= MAX_TIMEOUT_S):
        raise ValueError(f"crossover lease timeout must be a number of seconds in "
                         f"(0, {MAX_TIMEOUT_S:.0f}], got {timeout_s!r} (a finite bound turns a "
                         "stuck peer into an error instead of a hang)")
    return float(timeout_s)


@functools.lru_cache(maxsize=None)
def load_library() -> Any:
    """Loads _lease_ops.so once; raises a clear error if it was never built."""
    explicit = os.environ.get("CROSSOVER_LEASE_OPS")
    candidates = (pathlib.Path(explicit),) if explicit else LIBRARY_CANDIDATES
    for path in candidates:
        if path.exists():
            return tf.load_op_library(str(path))
    raise FileNotFoundError(
        f"crossover_tf lease op library not found (looked in {[str(c) for c in candidates]}); "
        "build it with `make -C ops PYTHON=$(which python)` or run scripts/install.sh")


def unlink(group: str, device_key: str) -> None:
    """Removes the segment name; processes that have it open keep working."""
    segments.segment_path(group, device_key).unlink(missing_ok=True)


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

    @classmethod
    def from_op(cls, values: np.ndarray, names: list[str]) -> "LeaseStats":
        """Builds the record from the stats op, whose field names come from the C++ core."""
        fields = {f.name: f.type for f in dataclasses.fields(cls)}
        if sorted(names) != sorted(fields):
            raise RuntimeError(f"lease op library reports stats {names}, this module expects "
                               f"{sorted(fields)}: rebuild the op library (make -C ops)")
        cast = {"int": int, "float": float, "bool": bool}
        return cls(**{n: cast[fields[n]](v) for n, v in zip(names, values)})

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in dataclasses.asdict(self).items()}


class DeviceLease:
    """One (group, device) lease as seen by this process; the methods build or run TF ops.

    acquire/release take a nest of tensors and return it unchanged, so that they can be
    threaded through a graph: `grads = lease.release(grads)` runs after grads exist.
    """

    def __init__(self, group: str, device_key: str, timeout_s: float = 600.0):
        self.group = validate_name("group", group, segments.GROUP_MAX_LEN)
        self.device_key = validate_name("device key", device_key, segments.DEVICE_KEY_MAX_LEN)
        self.timeout_s = validate_timeout(timeout_s)
        self._ops = load_library()

    def __repr__(self) -> str:
        return f"DeviceLease(group={self.group!r}, device_key={self.device_key!r})"

    def acquire(self, tensors: Any = (), tag: int = TAG_OTHER) -> Any:
        return self._pass_through(self._ops.crossover_acquire_lease, tensors,
                                  timeout_seconds=self.timeout_s, tag=tag)

    def release(self, tensors: Any = ()) -> Any:
        if not tf.nest.flatten(tensors):
            # Nothing to wait for: the host kernel, not a GPU one that would drain a stream.
            with tf.device("/CPU:0"):
                return self._pass_through(self._ops.crossover_yield_lease, tensors)
        return self._pass_through(self._ops.crossover_yield_lease, tensors)

    def _pass_through(self, op: Any, tensors: Any, **attrs: Any) -> Any:
        flat = tf.nest.flatten(tensors)
        out = op(flat, group=self.group, device_key=self.device_key, **attrs)
        if not flat:  # graph mode returns the Operation for an op without outputs
            return tensors
        return tf.nest.pack_sequence_as(tensors, out)

    def stats(self) -> LeaseStats:
        values, names = self._ops.crossover_lease_stats(group=self.group,
                                                        device_key=self.device_key)
        return LeaseStats.from_op(np.asarray(values), [n.decode() for n in np.asarray(names)])

    def timeline(self) -> np.ndarray:
        """[n, 4] int64: request_ns, acquired_ns, released_ns (0 = held), tag; wall clock."""
        return np.asarray(
            self._ops.crossover_lease_timeline(group=self.group, device_key=self.device_key))
