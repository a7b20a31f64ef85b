"""strategy.gradient_tape(tape): the custom loop's allreduce, as hvd.DistributedGradientTape.

Its gradient() runs the middle of the step protocol inside the loop's hold
(`_hold/custom_loop.DeviceHold`): yield -> allreduce in the job's link turn -> re-acquire, the
same verbs as the Keras train step (StepProtocol.allreduce_gradients_in_turn).
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from crossover_tf._hold.custom_loop import innermost_hold, reduce_yielded
from crossover_tf._protocol.optimizer_guard import refuse_inside_run
from crossover_tf._protocol.step_protocol import StepProtocol


class CrossoverGradientTape:
    """Like hvd.DistributedGradientTape, gradient() averages the gradients over the job's
    ranks, with the device yielded for the allreduce (and the link turn taken around it, when
    the job has one). Other attributes are the wrapped tape's."""

    def __init__(self, tape: tf.GradientTape, protocol: StepProtocol):
        self._tape = tape
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tape, name)

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        refuse_inside_run("strategy.gradient_tape(tape).gradient()")
        hold = innermost_hold()
        if self._protocol.is_crossover and hold is None:
            raise RuntimeError(
                "crossover_tf: strategy.gradient_tape(...).gradient() runs outside "
                "strategy.hold_device(); put the step (forward, gradient, apply) inside "
                "`with strategy.hold_device():` so its compute holds the device and the "
                "allreduce does not")
        grads = self._tape.gradient(target, sources, output_gradients, unconnected_gradients)
        flat = [None if g is None else tf.convert_to_tensor(g) for g in tf.nest.flatten(grads)]
        flat = reduce_yielded(flat, self._protocol.allreduce_gradients_in_turn)
        return tf.nest.pack_sequence_as(grads, flat)
