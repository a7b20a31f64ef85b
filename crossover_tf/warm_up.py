"""Compiles a train step's XLA parts before the job first takes the device lease.

XLA compiles a jit function the first time it runs. Under the lease that compile time (minutes
for a large model) would count against the peer's lease_timeout_s. So, before the first acquire,
compute and apply are traced for the data's type spec (the trace the step will reuse) and run
once on the first batch without the lease, from a graph as the step calls them (XLA's cache for
functions called from graphs is not the one eager calls fill); every variable they touch is
restored afterwards.
The compiled executables stay in XLA's cache and the model's state is as before. The price is
one step of device time outside the lease, once per compile.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tensorflow as tf
from keras.src.trainers.data_adapters import data_adapter_utils

if TYPE_CHECKING:
    from crossover_tf.train_step import CrossoverTrainStep


def compile_outside_lease(step: "CrossoverTrainStep", data: Any, spec: Any) -> None:
    """Traces step.compute for spec and step.apply, runs both on data, restores all state."""
    model = step.model
    step.compute.get_concrete_function(*data_adapter_utils.unpack_x_y_sample_weight(spec))
    state = _touched_variables(model)
    saved = [tf.identity(v).numpy() for v in state]
    try:
        tf.function(lambda batch: _compute_and_apply(step, batch))(data)
    finally:
        for variable, value in zip(state, saved):
            variable.assign(value)


def _compute_and_apply(step: "CrossoverTrainStep", data: Any) -> tf.Tensor:
    grads, _ = step.compute(*data_adapter_utils.unpack_x_y_sample_weight(data))
    return step.apply(grads)


def _touched_variables(model: Any) -> list[Any]:
    """Everything compute or apply may assign: weights, seeds, metrics, optimizer state."""
    variables = {id(v): v for v in [*model.variables, *model.metrics_variables,
                                    *model.optimizer.variables]}
    return list(variables.values())
