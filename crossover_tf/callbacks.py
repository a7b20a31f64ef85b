"""Keras callbacks that make model.fit a correct crossover job (see strategy.callbacks).

They take the rank's StepProtocol, never the strategy, as Horovod's callbacks take no
strategy: the strategy makes them, and nothing here reaches back into it.
"""
from __future__ import annotations

from typing import Any

import keras

from crossover_tf._keras import install as keras_install
from crossover_tf._protocol.step_protocol import StepProtocol


class CrossoverTrainStepCallback(keras.callbacks.Callback):
    """Makes fit (and evaluate, predict) run crossover steps as soon as fit hands over the model.

    Keras calls set_model while building its CallbackList, before make_train_function, so the
    hook is in place for the very first step. It also gives the device back when training ends
    (or fails), so the next job never waits on us, and leaves the link turn whenever this job
    stops stepping (validation, the epoch's end callbacks), joining again for the next epoch.
    Training's end leaves for good: the next fit joins at its first step, after its broadcast
    and compile (first_step), not at its first epoch's begin. A fit that fails outside a step
    skips on_train_end; _keras.fit_guard leaves for it.
    """

    def __init__(self, protocol: StepProtocol, micro_batches: int = 1):
        super().__init__()
        self.protocol = protocol
        self.micro_batches = micro_batches

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        keras_install.install(model, self.protocol, self.micro_batches)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.protocol.leave()

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.protocol.pause_link_turn()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.protocol.pause_link_turn()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.protocol.resume_link_turn()


class MetricAverage(keras.callbacks.Callback):
    """Averages epoch-level logs (training and validation metrics) over ranks, so rank 0's
    TensorBoard and History describe the whole job rather than its own shard. A collective,
    as Horovod's MetricAverageCallback is: every rank of the job must use it."""

    def __init__(self, protocol: StepProtocol):
        super().__init__()
        self.protocol = protocol

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs.update(self.protocol.average_logs(logs))


def for_fit(protocol: StepProtocol, micro_batches: int = 1,
            average_metrics: bool = True) -> list[keras.callbacks.Callback]:
    """The callbacks that make fit a crossover job of this rank (strategy.callbacks(), and
    fit on a model made under strategy.scope() with none given)."""
    result: list[keras.callbacks.Callback] = [CrossoverTrainStepCallback(protocol, micro_batches)]
    if average_metrics:  # a job of one rank averages nothing (StepProtocol.average_logs)
        result.append(MetricAverage(protocol))
    return result
