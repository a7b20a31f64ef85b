"""LeaseTensorBoard: a user's own fit logs what the device lease cost each step.

Keras's TensorBoard callback shows loss and metrics; whether a crossed job is held back by its
peer shows only in the lease: how long each step waited for the device, how long it held it,
and the share of the step it held it (near 1: the device is this job's bottleneck; low with a
long wait: the peer's compute is). It reuses StepTimer's per-step lease deltas, as
experiments' StepStatistics does, and writes on rank 0 only:

    model.fit(data, callbacks=[*strategy.callbacks(),
                               crossover_tf.LeaseTensorBoard(strategy, "logs/lease")])
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from crossover_tf.profiling.step_timer import StepTimer

if TYPE_CHECKING:
    from crossover_tf.strategy import CrossoverStrategy

SUMMED = ("step_time_s", "lease_wait_s", "lease_hold_s")


class LeaseTensorBoard(keras.callbacks.Callback):
    """Writes the scalars lease_wait_s and lease_hold_s (seconds per step) and
    lease_held_share (hold over step time) to ``log_dir`` on rank 0, every ``log_every``
    steps, each the mean over the steps since the last write (none is lost between writes).

    A step is the time between consecutive batch ends (StepTimer), so it counts input and
    callbacks too; each fit's clock starts at its first batch's begin, so time between fits
    is no step. Steps count on across fits. A job without a crossover group has no lease and
    is refused.
    """

    def __init__(self, strategy: "CrossoverStrategy", log_dir: str | os.PathLike, *,
                 log_every: int = 1):
        super().__init__()
        if not strategy.is_crossover:
            raise ValueError("crossover_tf.LeaseTensorBoard needs a crossover group: a job "
                             "without one (group='') takes no lease, so it has no lease "
                             "wait or hold to log")
        if log_every < 1:
            raise ValueError(f"LeaseTensorBoard: log_every must be >= 1, got {log_every}")
        self.strategy = strategy
        self.log_dir = os.fspath(log_dir)
        self.log_every = log_every
        self._writer: Any = None
        self._timer: StepTimer | None = None
        self._steps = 0
        self._sums = dict.fromkeys(SUMMED, 0.0)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._timer = StepTimer(self.strategy.lease_stats, global_batch_size=1)
        if self._writer is None and self.strategy.should_save_summary:
            self._writer = tf.summary.create_file_writer(self.log_dir)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._timer.begin()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        record = self._timer.end()
        self._timer.records.clear()  # only the sums are kept: a long fit grows nothing
        for key in SUMMED:
            self._sums[key] += record[key]
        self._steps += 1
        if self._steps % self.log_every == 0:
            self._write(self._steps - 1, self.log_every)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        left = self._steps % self.log_every
        if left:  # the last steps short of a whole window: written as their own mean
            self._write(self._steps - 1, left)
        if self._writer is not None:
            self._writer.flush()

    def _write(self, step: int, steps: int) -> None:
        """The mean over the `steps` steps summed since the last write, at `step`."""
        sums, self._sums = self._sums, dict.fromkeys(SUMMED, 0.0)
        if self._writer is None:
            return
        with self._writer.as_default(step=step):
            tf.summary.scalar("lease_wait_s", sums["lease_wait_s"] / steps)
            tf.summary.scalar("lease_hold_s", sums["lease_hold_s"] / steps)
            tf.summary.scalar("lease_held_share",
                              sums["lease_hold_s"] / max(sums["step_time_s"], 1e-12))
