"""What must happen before a fit's first step, before the job first takes the device lease.

1. Build everything a step updates from the first batch: layers, metrics, loss and the
   optimizer's slots. Without a tf.distribute strategy Keras 3 leaves this to the first trace,
   which is too late for 2: a subclassed model or Adam's slots would not exist yet.
2. Copy rank 0's weights and optimizer state to every rank (sync_state), so differently seeded
   ranks, or a checkpoint restored on rank 0 only, start identical. Once per fit, like
   Horovod's broadcast callback (which runs after the first batch for the same reason).
3. Compile the XLA parts outside the lease (warm_up).
The batch used for this is then the first one trained on (or evaluated), as usual.
"""
from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import keras
import tensorflow as tf

from crossover_tf import warm_up

if TYPE_CHECKING:
    from crossover_tf.train_step import CrossoverTrainStep

SyncState = Callable[[Sequence[Any]], None]


def model_state(model: keras.Model) -> list[Any]:
    """What ranks must agree on: weights (BatchNorm statistics included) and optimizer state.
    Random seed states are left per rank, so dropout masks differ across ranks as in Horovod."""
    variables = list(model.weights)
    if model.optimizer is not None:
        variables += list(model.optimizer.variables)
    return variables


class PreparedFunction:
    """Keras' train or test function for one fit/evaluate call: before its first step it
    builds everything from the first batch (1 above); for training, also 2 and 3."""

    def __init__(self, function: Callable[[Any], Any], model: keras.Model,
                 train_step: "CrossoverTrainStep | None" = None,
                 sync_state: SyncState | None = None):
        self.function = function
        self.model = model
        self.train_step = train_step
        self.sync_state = sync_state
        self.prepared = False

    def __call__(self, iterator: Any) -> Any:
        if not self.prepared:
            iterator = self._prepare(iterator)
            self.prepared = True
        return self.function(iterator)

    def _prepare(self, iterator: Any) -> Iterator[Any]:
        spec = getattr(iterator, "element_spec", None)
        data = next(iterator)  # end of data: StopIteration, which Keras handles
        if spec is None:
            spec = tf.nest.map_structure(_spec_of, data)
        model = self.model
        model._symbolic_build(data_batch=data)
        step = self.train_step
        if step is not None:
            if not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)
            if self.sync_state is not None:
                self.sync_state(model_state(model))
            if step.lease is not None and step.jit_compile:
                warm_up.compile_outside_lease(step, data, spec)
        return itertools.chain([data], iterator)


def _spec_of(value: Any) -> Any:
    return None if value is None else tf.TensorSpec.from_tensor(tf.convert_to_tensor(value))
