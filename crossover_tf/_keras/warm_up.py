"""Compiles a step's XLA parts before the job first takes the device lease for them.

XLA compiles a jit function the first time it runs. Under the lease that compile time (minutes
for a large model) would count against the peer's LeaseOptions.timeout_s. So, before the first
acquire, the parts (traced by the caller for the data's type spec, the trace the step will
reuse) run once on the first batch without the lease, from a graph as the step calls them (XLA's
cache for functions called from graphs is not the one eager calls fill); every variable they
may touch is restored afterwards. The compiled executables stay in XLA's cache and the model's
state is as before. The price is one step of device time outside the lease, once per compile.
"""
from __future__ import annotations

from typing import Any, Callable

import keras
import tensorflow as tf


def compile_outside_lease(model: keras.Model, parts: Callable[[Any], Any], data: Any) -> None:
    """Runs parts(data) once from a graph, then restores the model's, metrics' and optimizer's
    variables to their values before."""
    state = _touched_variables(model)
    saved = [tf.identity(v).numpy() for v in state]
    try:
        tf.function(parts)(data)
    finally:
        for variable, value in zip(state, saved):
            variable.assign(value)


def _touched_variables(model: keras.Model) -> list[Any]:
    """Everything a step may assign: weights, seeds, metrics, optimizer state."""
    optimizer = [] if model.optimizer is None else model.optimizer.variables
    variables = {id(v): v for v in [*model.variables, *model.metrics_variables, *optimizer]}
    return list(variables.values())
