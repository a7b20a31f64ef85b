"""Keras callbacks that make model.fit a correct crossover/Horovod job (see strategy.callbacks).

They take what the steps need (keras_hooks.CrossoverSetup), never the strategy, as Horovod's
callbacks take no strategy: the strategy makes them, and nothing here reaches back into it.
"""
from __future__ import annotations

from typing import Any, Callable

import keras

from crossover_tf._keras import hooks as keras_hooks


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

    def __init__(self, setup: keras_hooks.CrossoverSetup):
        super().__init__()
        self.setup = setup

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        keras_hooks.install(model, self.setup)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        keras_hooks.leave(self.setup.lease, self.setup.turn)

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._pause_turn()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._pause_turn()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.setup.turn is not None:
            self.setup.turn.resume()

    def _pause_turn(self) -> None:
        if self.setup.turn is not None:
            self.setup.turn.pause()


class MetricAverage(keras.callbacks.Callback):
    """Averages epoch-level logs (training and validation metrics) over ranks, so rank 0's
    TensorBoard and History describe the whole job rather than its own shard. A collective,
    as Horovod's MetricAverageCallback is: every rank of the job must use it.

    average: the communicator's average_scalars (None: a job of one rank, nothing to do)."""

    def __init__(self, average: Callable[[dict[str, Any]], dict[str, Any]] | None):
        super().__init__()
        self.average = average

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is None or self.average is None:
            return
        logs.update(self.average(logs))
