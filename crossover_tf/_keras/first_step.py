"""What must happen before the first step of a fit (or evaluate, predict), before the lease.

1. Build everything a step updates from the first batch: layers, metrics, loss and the
   optimizer's slots. Without a tf.distribute strategy Keras 3 leaves this to the first trace,
   which is too late for 2 (a subclassed model or Adam's slots would not exist yet) and fails
   inside a nested XLA function.
2. Training: copy rank 0's weights and optimizer state to every rank (broadcast_state), so
   differently seeded ranks, or a checkpoint restored on rank 0 only, start identical. Once per
   fit, like Horovod's broadcast callback (which runs after the first batch for the same
   reason), and once per compiled step for train_on_batch, which Keras prepares on every call
   (a broadcast each step would move the whole state as often as the gradients:
   strategy.broadcast_variables after restoring on rank 0 between one-batch steps).
3. With XLA and a lease: compile the step's XLA parts outside the lease (warm_up), once per
   step (a step lives until the next compile).
4. With a link turn: join it (StepProtocol.join_link_turn, a collective of the job's ranks),
   once per fit, after 3 so the peer never waits for our compilation.
The batch used for this is then the first one trained on (or evaluated), as usual.
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
from typing import TYPE_CHECKING, Any, Callable, Iterator

import keras
import tensorflow as tf

from crossover_tf._keras import compat as keras_compat
from crossover_tf._keras import warm_up

if TYPE_CHECKING:
    from crossover_tf._keras.inference_step import LeasedInferenceStep
    from crossover_tf._keras.train_step import CrossoverTrainStep

BeforeFirstStep = Callable[[Any, Any], None]  # (first batch, its type spec)


def model_state(model: keras.Model) -> list[Any]:
    """What ranks must agree on: weights (BatchNorm statistics included) and optimizer state.
    Random seed states are left per rank, so dropout masks differ across ranks as in Horovod."""
    variables = list(model.weights)
    if model.optimizer is not None:
        variables += list(model.optimizer.variables)
    return variables


class PreparedFunction:
    """Keras' train, test or predict function for one fit/evaluate/predict call; runs
    before_first_step on the first batch before its first step."""

    def __init__(self, function: Callable[[Any], Any], before_first_step: BeforeFirstStep):
        self.function = function
        self.before_first_step = before_first_step
        self.prepared = False

    def __call__(self, data: Any) -> Any:
        if not self.prepared:
            data = self._prepare(data)
            self.prepared = True
        return self.function(data)

    def _prepare(self, data: Any) -> Any:
        if isinstance(data, list):  # predict: a list of batches
            self.before_first_step(data[0], tf.nest.map_structure(_spec_of, data[0]))
            return data
        spec = getattr(data, "element_spec", None)
        first = next(data)  # end of data: StopIteration, which Keras handles
        self.before_first_step(first, spec or tf.nest.map_structure(_spec_of, first))
        return itertools.chain([first], data)


_ONE_BATCH = contextvars.ContextVar("crossover_tf_one_batch_step", default=False)


@contextlib.contextmanager
def one_batch_step() -> Iterator[None]:
    """Marks a train_on_batch call: its step is prepared (1-4) on the first call only."""
    token = _ONE_BATCH.set(True)
    try:
        yield
    finally:
        _ONE_BATCH.reset(token)


def before_training(step: "CrossoverTrainStep") -> BeforeFirstStep:
    """1-4 for a train step (for train_on_batch, once per step; 4 again after a leave)."""
    protocol = step.protocol

    def prepare(data: Any, spec: Any) -> None:
        one_batch = _ONE_BATCH.get()
        if one_batch and step.prepared_for_one_batch:
            protocol.join_link_turn()  # rejoins after strategy.leave_device(); else a no-op
            return
        model = step.model
        keras_compat.build_from_batch(model, data)
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        protocol.broadcast_state(model_state(model))
        if protocol.is_crossover and step.jit_compile and not step.compiled:
            step.compute.get_concrete_function(*keras.utils.unpack_x_y_sample_weight(spec))
            warm_up.compile_outside_lease(model, step.compute_and_apply, data)
            step.compiled = True
        protocol.join_link_turn()
        step.prepared_for_one_batch = one_batch

    return prepare


def before_inference(step: "LeasedInferenceStep", build: bool) -> BeforeFirstStep:
    """1 (for test steps: predict has no metrics to build) and 3 for a test or predict step."""

    def prepare(data: Any, spec: Any) -> None:
        if build:
            keras_compat.build_from_batch(step.model, data)
        if step.jit_compile and not step.compiled:
            step.run.get_concrete_function(spec)
            warm_up.compile_outside_lease(step.model, step.run, data)
            step.compiled = True

    return prepare


def _spec_of(value: Any) -> Any:
    return None if value is None else tf.TensorSpec.from_tensor(tf.convert_to_tensor(value))
