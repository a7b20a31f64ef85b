"""The crossover train step and the hook that makes Keras' model.fit use it.

Keras compiles the whole train step with XLA when `jit_compile=True`, but Horovod's collectives
have no XLA kernels and the device lease must be released *between* compute and communication.
So the step is split:

    acquire(compute) -> [forward+backward+metrics: XLA] -> yield -> grouped allreduce
                     -> acquire(apply) -> [optimizer update: XLA] -> yield

The outer step is an ordinary tf.function; the two bracketed parts are nested
tf.function(jit_compile=...) calls, i.e. XLA clusters of their own. The lease ops thread the
tensors through so data flow fixes their order, and the device is never held while this process
waits in a collective. With no crossover group the lease ops are simply absent (plain Horovod).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable

import keras
import tensorflow as tf
from absl import logging
from keras.src.losses import loss as keras_loss
from keras.src.trainers.data_adapters import data_adapter_utils

from crossover_tf import lease as lease_lib

if TYPE_CHECKING:
    from crossover_tf.strategy import CrossoverStrategy

_XLA_FAILURE = re.compile(r"XLA|compil", re.IGNORECASE)
_XLA_ERROR_TYPES = (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError)


class CrossoverTrainStep:
    """Replacement for `model.train_step`, built for one model and one strategy."""

    def __init__(self, model: keras.Model, strategy: "CrossoverStrategy", jit_compile: bool):
        self.model = model
        self.strategy = strategy
        self.jit_compile = bool(jit_compile)
        # The function names are what XLA dumps and profiles show: keep them recognisable.
        self.compute = tf.function(self.crossover_compute_gradients,
                                   jit_compile=self.jit_compile, reduce_retracing=True)
        self.apply = tf.function(self.crossover_apply_gradients,
                                 jit_compile=self.jit_compile, reduce_retracing=True)

    def crossover_compute_gradients(self, x: Any, y: Any,
                                    sample_weight: Any) -> tuple[list[Any], dict[str, Any]]:
        """Forward, loss, backward and metric updates: everything that needs the device."""
        model = self.model
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True) if model._call_has_training_arg else model(x)
            loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                       training=True)
            batch = tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0]
            model._loss_tracker.update_state(
                keras_loss.unscale_loss_for_distribution(loss), sample_weight=batch)
            if model.optimizer is not None:
                loss = model.optimizer.scale_loss(loss)
        grads = tape.gradient(loss, model.trainable_weights)
        grads = [None if g is None else tf.convert_to_tensor(g) for g in grads]
        return grads, model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def crossover_apply_gradients(self, grads: list[Any]) -> tf.Tensor:
        """The optimizer update; returns the step counter so callers can order after it."""
        pairs = [(g, v) for g, v in zip(grads, self.model.trainable_weights) if g is not None]
        self.model.optimizer.apply_gradients(pairs)
        return tf.identity(self.model.optimizer.iterations)

    def __call__(self, data: Any) -> dict[str, Any]:
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        if not self.model.trainable_weights:
            raise ValueError("crossover_tf: the model has no trainable weights to train")
        lease = self.strategy.lease
        if lease is not None:
            x = lease.acquire(x, tag=lease_lib.TAG_COMPUTE)
        grads, metrics = self.compute(x, y, sample_weight)
        grads = self.strategy.synchronize_gradients(grads)
        iterations = self.apply(grads)
        if lease is not None:
            lease.release([iterations])
        return metrics


def install(model: keras.Model, strategy: "CrossoverStrategy") -> CrossoverTrainStep:
    """Makes `model.fit` train with the crossover step; idempotent per (model, strategy).

    Works on the instance only: `train_step` and `make_train_function` are shadowed by
    instance attributes, and Keras' own make_train_function is reused with the outer
    function's jit turned off (the compute and apply parts carry the model's jit setting).
    """
    existing = model.__dict__.get("_crossover_train_step")
    if existing is not None and existing.strategy is strategy:
        return existing
    if model.optimizer is None:
        raise ValueError("crossover_tf: compile the model (with an optimizer) before fit")
    step = CrossoverTrainStep(model, strategy, jit_compile=model.jit_compile)
    logging.info("crossover_tf: compute/apply jit_compile=%s, crossover=%s",
                 step.jit_compile, strategy.lease)
    original_make = type(model).make_train_function

    def make_train_function(force: bool = False) -> Callable[..., Any]:
        if model.train_function is not None and not force:
            return model.train_function
        saved = model.jit_compile
        model._jit_compile = False  # bypass the setter: we only switch off the outer function
        try:
            original_make(model, force=True)
        finally:
            model._jit_compile = saved
        model.train_function = _release_on_error(model.train_function, strategy, step)
        return model.train_function

    object.__setattr__(model, "_crossover_train_step", step)
    object.__setattr__(model, "train_step", step)
    object.__setattr__(model, "make_train_function", make_train_function)
    model.train_function = None
    return step


def _release_on_error(train_function: Callable[..., Any], strategy: "CrossoverStrategy",
                      step: CrossoverTrainStep) -> Callable[..., Any]:
    """Never leave the device leased by a step that failed; explain XLA compile failures."""

    def guarded(iterator: Any) -> Any:
        try:
            return train_function(iterator)
        except StopIteration:
            raise
        except tf.errors.OpError as err:
            strategy.release_device()
            if (step.jit_compile and isinstance(err, _XLA_ERROR_TYPES)
                    and _XLA_FAILURE.search(err.message or "")):
                raise RuntimeError(
                    "crossover_tf: XLA could not compile the model's training computation "
                    "(model.compile(jit_compile=True)). Compile the model with "
                    "jit_compile=False (or 'auto', which lets Keras decide), or replace the "
                    f"unsupported op. TensorFlow said: {err.message[:2000]}") from err
            raise
        except BaseException:
            strategy.release_device()
            raise

    return guarded

