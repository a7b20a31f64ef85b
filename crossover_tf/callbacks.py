"""Keras callbacks that make model.fit a correct crossover/Horovod job (see strategy.callbacks)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import keras

from crossover_tf import collectives, train_step

if TYPE_CHECKING:
    from crossover_tf.strategy import CrossoverStrategy


class CrossoverTrainStepCallback(keras.callbacks.Callback):
    """Installs the crossover train step as soon as fit hands over the model.

    Keras calls set_model while building its CallbackList, before make_train_function, so the
    hook is in place for the very first step. It also gives the device back when training ends
    (or fails), so evaluate/predict and the next job never wait on us.
    """

    def __init__(self, strategy: "CrossoverStrategy"):
        super().__init__()
        self.strategy = strategy

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        train_step.install(model, self.strategy)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.strategy.release_device()


class BroadcastInitialState(keras.callbacks.Callback):
    """Copies rank 0's weights and optimizer state to every rank before the first step.

    Keras builds the optimizer before on_train_begin, so its slots exist by then. Done once
    per callback instance, like Horovod's BroadcastGlobalVariablesCallback.
    """

    def __init__(self, strategy: "CrossoverStrategy", root_rank: int = 0):
        super().__init__()
        self.strategy = strategy
        self.root_rank = root_rank
        self.done = False

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.done or self.strategy.size == 1:
            return
        variables = list(self.model.variables)
        if self.model.optimizer is not None:
            variables += list(self.model.optimizer.variables)
        collectives.broadcast_variables(variables, self.root_rank)
        self.done = True


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
