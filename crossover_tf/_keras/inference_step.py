"""Keras' own test and predict steps, run holding the device lease.

evaluate, fit's validation passes and predict use the device like training does, so each of
their steps takes the lease and gives it back before the next step: the peer can train between
our evaluation steps, and nothing is held while epoch-end metric averaging (a collective) runs.
"""
from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from crossover_tf import lease as lease_lib
from crossover_tf._hold.device_hold import as_unit
from crossover_tf._protocol.step_protocol import StepProtocol


class LeasedInferenceStep:
    """Replacement for `model.test_step` or `model.predict_step` (kind 'test' / 'predict')."""

    def __init__(self, model: keras.Model, protocol: StepProtocol, kind: str):
        self.model = model
        self.protocol = protocol
        self.keras_step = getattr(type(model), f"{kind}_step")
        self.jit_compile = bool(model.jit_compile)
        self.compiled = False  # set once warm_up compiled its XLA parts
        self.run = tf.function(as_unit(self.crossover_inference_step), jit_compile=self.jit_compile,
                               reduce_retracing=True)

    def __call__(self, data: Any) -> Any:
        return self.protocol.hold(lease_lib.TAG_OTHER, self.run, data)

    def crossover_inference_step(self, data: Any) -> Any:
        """The model's test_step or predict_step (a subclass's override included)."""
        return self.keras_step(self.model, data)
