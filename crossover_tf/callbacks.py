"""Keras callbacks that make model.fit a correct crossover/Horovod job (see strategy.callbacks)."""
from __future__ import annotations

import resource
import time
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
import tensorflow as tf

from crossover_tf import collectives

if TYPE_CHECKING:
    from crossover_tf.strategy import CrossoverStrategy


class CrossoverTrainStepCallback(keras.callbacks.Callback):
    """Makes fit (and evaluate, predict) run crossover steps as soon as fit hands over the model.

    Keras calls set_model while building its CallbackList, before make_train_function, so the
    hook is in place for the very first step. It also gives the device back when training ends
    (or fails), so the next job never waits on us, and leaves the link turn whenever this job
    stops stepping (validation, the epoch's end callbacks), joining again for the next epoch.
    Training's end leaves for good: the next fit joins at its first step, after its broadcast
    and compile (first_step), not at its first epoch's begin. A fit that fails outside a step
    skips on_train_end; keras_hooks.guard_fit leaves for it.
    """

    def __init__(self, strategy: "CrossoverStrategy"):
        super().__init__()
        self.strategy = strategy

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        self.strategy.prepare(model)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.strategy.release_device()

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._pause_turn()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._pause_turn()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.strategy.turn is not None:
            self.strategy.turn.resume()

    def _pause_turn(self) -> None:
        if self.strategy.turn is not None:
            self.strategy.turn.pause()


class MetricAverage(keras.callbacks.Callback):
    """Averages epoch-level logs (training and validation metrics) over ranks, so rank 0's
    TensorBoard and History describe the whole job rather than its own shard."""

    def __init__(self, strategy: "CrossoverStrategy"):
        super().__init__()
        self.strategy = strategy

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is None or self.strategy.size == 1:
            return
        logs.update(collectives.average_scalars(logs))


class StepStatistics(keras.callbacks.Callback):
    """Per-step wall time, throughput, loss and lease wait/hold; TensorBoard scalars on rank 0.

    Step time is measured between consecutive batch ends, i.e. what a user waits per step,
    including input and callback overhead; cpu_s is the CPU time the whole process (every
    thread: TensorFlow's, Horovod's, Gloo's) used in that interval, which is what a step demands
    of a CPU device shared by time slicing. Lease numbers are this step's deltas of the
    process's lease statistics (zero without a crossover group). `description` (e.g. the job's
    name, lease group and priority) goes to TensorBoard's text tab once, as a table, so the
    runs of several jobs sharing a device can be told apart.
    """

    def __init__(self, strategy: "CrossoverStrategy", global_batch_size: int,
                 logdir: str | None = None, log_every: int = 1,
                 description: dict[str, str] | None = None):
        super().__init__()
        self.strategy = strategy
        self.global_batch_size = global_batch_size
        self.log_every = max(1, int(log_every))
        self.records: list[dict[str, float]] = []
        self._writer = (tf.summary.create_file_writer(logdir)
                        if logdir and strategy.should_save_summary else None)
        self._last_end: float | None = None
        self._last_cpu = 0.0
        self._last_lease: dict[str, float] = {}
        self._step = 0
        self.description = dict(description or {})

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self._writer is None or not self.description:
            return
        rows = "\n".join(f"| {key} | {value} |" for key, value in self.description.items())
        with self._writer.as_default(step=0):
            tf.summary.text("job", f"| setting | value |\n|---|---|\n{rows}")

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._last_end is None:
            self._last_end = time.perf_counter()
            self._last_cpu = process_cpu_s()
            self._last_lease = self.strategy.lease_stats()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        now, cpu = time.perf_counter(), process_cpu_s()
        lease = self.strategy.lease_stats()
        step_time = now - self._last_end
        record = {"step": self._step, "end_ns": time.time_ns(), "step_time_s": step_time,
                  "images_per_s": self.global_batch_size / step_time,
                  "cpu_s": cpu - self._last_cpu,
                  "lease_wait_s": lease.get("wait_s", 0.0) - self._last_lease.get("wait_s", 0.0),
                  "lease_hold_s": lease.get("hold_s", 0.0) - self._last_lease.get("hold_s", 0.0)}
        for key, value in (logs or {}).items():
            if np.ndim(value) == 0:
                record[key] = float(value)
        self.records.append(record)
        if self._writer is not None and self._step % self.log_every == 0:
            with self._writer.as_default(step=self._step):
                for key, value in record.items():
                    if key not in ("step", "end_ns"):
                        tf.summary.scalar(key, value)
        self._last_end, self._last_cpu, self._last_lease = now, cpu, lease
        self._step += 1

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._writer is not None:
            self._writer.flush()


def process_cpu_s() -> float:
    """User + system CPU seconds of this process so far, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
