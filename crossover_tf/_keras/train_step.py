"""The crossover train step: one training step of the rank's StepProtocol.

Keras compiles the whole train step with XLA when `jit_compile=True`, but Horovod's collectives
have no XLA kernels and the device lease must be yielded *between* compute and communication.
So the step is split:

    acquire(compute) -> [forward+backward+metrics: XLA] -> yield -> grouped allreduce
                     -> acquire(apply) -> [optimizer update: XLA] -> yield

With a link turn the allreduce is bracketed too: turn wait -> allreduce -> turn done, so the
group's jobs use the network one at a time (lease.link_turn).

With micro_batches > 1 (a secondary job in priority mode) the compute part runs once per
micro-batch, each under its own hold, accumulating the gradients: between micro-batches a
waiting primary gets the device, so it never waits longer than one micro-batch.

The outer step is an ordinary tf.function; the two bracketed parts are nested
tf.function(jit_compile=...) calls, i.e. XLA clusters of their own, each run through the
rank's StepProtocol (hold, allreduce_gradients_in_turn). The device is never held while this
process waits in a collective. With no crossover group the lease ops are simply absent (plain
data parallelism).
"""
from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from crossover_tf import lease as lease_lib
from crossover_tf._hold.device_hold import as_unit
from crossover_tf._keras import compat as keras_compat
from crossover_tf._protocol import gradient_sync
from crossover_tf._protocol.step_protocol import StepProtocol


class CrossoverTrainStep:
    """Replacement for `model.train_step`, built for one compiled state of one model.

    Built again whenever Keras remakes its train function (every compile): the nested
    tf.functions capture the optimizer, metrics and trainable variables they were traced with.
    """

    def __init__(self, model: keras.Model, protocol: StepProtocol, micro_batches: int = 1):
        self.model = model
        self.protocol = protocol
        self.jit_compile = bool(model.jit_compile)
        self.micro_batches = micro_batches  # checked where it was given (options)
        self.compiled = False  # set once warm_up compiled its XLA parts
        self.prepared_for_one_batch = False  # train_on_batch prepared it (first_step)
        # The function names are what XLA dumps and profiles show: keep them recognisable.
        self.compute = tf.function(as_unit(self.crossover_compute_gradients),
                                   jit_compile=self.jit_compile, reduce_retracing=True)
        self.apply = tf.function(as_unit(self.crossover_apply_gradients),
                                 jit_compile=self.jit_compile, reduce_retracing=True)

    def __call__(self, data: Any) -> dict[str, Any]:
        """One step's whole lease protocol, in order:

        acquire(compute) -> forward, loss, backward, metrics -> yield
        -> allreduce of the gradients (the device is free for the peer meanwhile)
        -> acquire(apply) -> optimizer update -> yield
        """
        grads, metrics = None, {}
        for micro in self._micro_batches(data):
            grads, metrics = self.protocol.hold(lease_lib.TAG_COMPUTE, self.compute, *micro,
                                                grads)
        grads = self.protocol.allreduce_gradients_in_turn(grads)
        self.protocol.hold(lease_lib.TAG_APPLY, self.apply, grads, step_end=True)
        return metrics

    def compute_and_apply(self, data: Any) -> tf.Tensor:
        """compute then apply without lease or allreduce: what warm_up compiles."""
        grads = None
        for micro in self._micro_batches(data):
            grads, _ = self.compute(*micro, grads)
        return self.apply(grads)

    def _micro_batches(self, data: Any) -> list[tuple[Any, Any, Any]]:
        """(x, y, sample_weight) of each micro-batch: equal consecutive slices of the batch."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        n = self.micro_batches
        if n == 1:
            return [(x, y, sample_weight)]
        batch = tf.shape(tf.nest.flatten(x)[0])[0]
        check = tf.debugging.assert_equal(
            batch % n, 0, message=f"crossover_tf: the per-rank batch must divide into "
            f"micro_batches={n} equal micro-batches")
        with tf.control_dependencies([check]):
            size = batch // n

        def piece(i: int) -> Any:
            return lambda t: None if t is None else t[i * size:(i + 1) * size]
        return [tuple(tf.nest.map_structure(piece(i), part) for part in (x, y, sample_weight))
                for i in range(n)]

    def crossover_compute_gradients(self, x: Any, y: Any, sample_weight: Any,
                                    accumulated: list[Any] | None = None
                                    ) -> tuple[list[Any], dict[str, Any]]:
        """Forward, loss, backward and metric updates: everything that needs the device.

        With micro-batches, each one's gradient is scaled by 1/micro_batches and added to the
        accumulated sum: equal micro-batches of a mean loss then give the full batch's gradient.
        """
        model = self.model
        if not model.trainable_weights:
            raise ValueError("crossover_tf: the model has no trainable weights to train")
        with tf.GradientTape() as tape:
            y_pred = keras_compat.call_training(model, x)
            loss = keras_compat.compute_loss(model, x, y, y_pred, sample_weight)
            batch = tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0]
            keras_compat.track_loss(model, loss, batch)
            if model.optimizer is not None:
                loss = model.optimizer.scale_loss(loss)
            if self.micro_batches > 1:
                loss = loss / self.micro_batches
        grads = tape.gradient(loss, model.trainable_weights)
        grads = [None if g is None else tf.convert_to_tensor(g) for g in grads]
        if accumulated is not None:
            grads = [g if a is None else a + g for a, g in zip(accumulated, grads)]
        return grads, model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def crossover_apply_gradients(self, grads: list[Any]) -> tf.Tensor:
        """The optimizer update; returns the step counter so callers can order after it."""
        pairs = [(g, v) for g, v in zip(grads, self.model.trainable_weights) if g is not None]
        with gradient_sync.reduced_by_the_step():  # the step reduced them (traced apart)
            self.model.optimizer.apply_gradients(pairs)
        return tf.identity(self.model.optimizer.iterations)
