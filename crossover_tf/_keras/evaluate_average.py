"""evaluate returns the job's metrics on every rank, averaged over the ranks as fit's epoch
logs are (callbacks.MetricAverage).

Why: each rank evaluates its own shard (and BatchNorm's moving statistics are per rank), so
without this two ranks report different numbers for one model.
"""
from __future__ import annotations

import functools
from typing import Any

import keras

from crossover_tf._protocol.step_protocol import StepProtocol


def average_evaluate(model: keras.Model, protocol: StepProtocol) -> None:
    """Shadows model.evaluate so that it returns the ranks' average in the form Keras returns:
    a scalar, a list or, with return_dict=True, a dict. A collective: every rank must call
    evaluate, as every rank calls fit."""
    keras_evaluate = type(model).evaluate

    @functools.wraps(keras_evaluate)
    def evaluate(*args: Any, **kwargs: Any) -> Any:
        result = keras_evaluate(model, *args, **kwargs)
        if isinstance(result, dict):
            return protocol.average_logs(result)
        values = result if isinstance(result, list) else [result]
        averaged = protocol.average_logs({str(i): v for i, v in enumerate(values)})
        values = [averaged[str(i)] for i in range(len(values))]
        return values if isinstance(result, list) else values[0]

    object.__setattr__(model, "evaluate", evaluate)
