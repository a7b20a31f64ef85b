"""StepStatistics: a training job's per-step record, logged to TensorBoard for the experiments.

The runtime's StepTimer (crossover_tf.profiling) measures each step; this adds what the
experiments need to read runs side by side: TensorBoard scalars on rank 0 (step time, images/s,
CPU time, lease wait and hold, loss and metrics) and, once, a table describing the job (its
name, lease group and priority), so the runs of several jobs sharing a device can be told
apart.
"""
from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from crossover_tf.profiling import StepTimer
from crossover_tf.profiling.step_timer import CLOCK_KEYS


class StepStatistics(keras.callbacks.Callback):
    """Per-step records (StepTimer's) and TensorBoard scalars on rank 0, every log_every
    steps."""

    def __init__(self, strategy: Any, global_batch_size: int, logdir: str | None = None,
                 log_every: int = 1, description: dict[str, str] | None = None):
        super().__init__()
        self.timer = StepTimer(strategy.lease_stats, global_batch_size)
        self.log_every = max(1, int(log_every))
        self._writer = (tf.summary.create_file_writer(logdir)
                        if logdir and strategy.should_save_summary else None)
        self.description = dict(description or {})

    @property
    def records(self) -> list[dict[str, float]]:
        return self.timer.records

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self._writer is None or not self.description:
            return
        rows = "\n".join(f"| {key} | {value} |" for key, value in self.description.items())
        with self._writer.as_default(step=0):
            tf.summary.text("job", f"| setting | value |\n|---|---|\n{rows}")

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.timer.begin()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        record = self.timer.end(logs)
        step = int(record["step"])
        if self._writer is not None and step % self.log_every == 0:
            with self._writer.as_default(step=step):
                for key, value in record.items():
                    if key not in CLOCK_KEYS:
                        tf.summary.scalar(key, value)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._writer is not None:
            self._writer.flush()
