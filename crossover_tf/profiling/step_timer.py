"""StepTimer: what each training step cost, measured between consecutive batch ends.

A step's time is what a user waits per step, input and callbacks included; its CPU time is
what the whole process (every thread: TensorFlow's, Horovod's, Gloo's) used meanwhile, which
is what a step demands of a CPU shared by time slicing. A profile is made of these, and
experiments' StepStatistics logs them to TensorBoard.
"""
from __future__ import annotations

import resource
import time
from typing import Any, Callable

import numpy as np

# A record's instants, not quantities to plot: the step's number and its end on the wall clock
# (to line up with other processes) and on the monotonic clock (its length, whatever the wall
# clock did: crossover_tf_planner/clock_steps.py).
CLOCK_KEYS = ("step", "end_ns", "mono_end_ns")


class StepTimer:
    """Records one dict per step: step, end_ns (wall clock), mono_end_ns (monotonic clock),
    step_time_s, images_per_s,
    cpu_s, lease_wait_s and lease_hold_s (this step's deltas of the process's lease
    statistics; zero without a crossover group), and the step's scalar Keras logs."""

    def __init__(self, lease_stats: Callable[[], dict[str, float]], global_batch_size: int):
        self.lease_stats = lease_stats
        self.global_batch_size = global_batch_size
        self.records: list[dict[str, float]] = []
        self._last_end: float | None = None
        self._last_cpu = 0.0
        self._last_lease: dict[str, float] = {}

    def begin(self) -> None:
        """Call at each batch's begin: the first one starts the clock."""
        if self._last_end is None:
            self._last_end = time.perf_counter()
            self._last_cpu = process_cpu_s()
            self._last_lease = self.lease_stats()

    def end(self, logs: dict[str, Any] | None = None) -> dict[str, float]:
        """Call at each batch's end; returns (and keeps) the step's record."""
        if self._last_end is None:
            raise RuntimeError("StepTimer.end called before begin")
        now, cpu = time.perf_counter(), process_cpu_s()
        lease = self.lease_stats()
        step_time = now - self._last_end
        wall_ns, mono_ns = clock_pair()
        record = {"step": len(self.records), "end_ns": wall_ns, "mono_end_ns": mono_ns,
                  "step_time_s": step_time,
                  "images_per_s": self.global_batch_size / step_time,
                  "cpu_s": cpu - self._last_cpu,
                  "lease_wait_s": _delta(lease, self._last_lease, "wait_s"),
                  "lease_hold_s": _delta(lease, self._last_lease, "hold_s")}
        for key, value in (logs or {}).items():
            if np.ndim(value) == 0:
                record[key] = float(value)
        self.records.append(record)
        self._last_end, self._last_cpu, self._last_lease = now, cpu, lease
        return record


PAIR_TRIES = 5
PAIR_GAP_NS = 100_000


def clock_pair() -> tuple[int, int]:
    """The wall and the monotonic clock read at one instant: the wall clock between two
    monotonic reads, the tightest of a few tries. Read one after the other, a thread preempted
    between them (milliseconds on a busy 2-core machine) made a step's two lengths differ as if
    the wall clock had stepped, and refused a real comparison's scenario (clock_steps.py)."""
    best: tuple[int, int, int] | None = None
    for _ in range(PAIR_TRIES):
        before = time.monotonic_ns()
        wall = time.time_ns()
        gap = time.monotonic_ns() - before
        if best is None or gap < best[0]:
            best = (gap, wall, before + gap // 2)
        if gap <= PAIR_GAP_NS:
            break
    assert best is not None
    return best[1], best[2]


def process_cpu_s() -> float:
    """User + system CPU seconds of this process so far, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _delta(now: dict[str, float], before: dict[str, float], key: str) -> float:
    return now.get(key, 0.0) - before.get(key, 0.0)
