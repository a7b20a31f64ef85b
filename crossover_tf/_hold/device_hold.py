"""Runs one part of a step with the device held: acquire -> all of the part's work -> yield.

Data flow alone orders only the ops that consume the acquired tensors. Regularisation terms,
learning-rate schedules, seed and metric updates do not depend on the batch, so with
jit_compile=False (where a part's body is inlined into the step graph) they could run before
the acquire or after the yield. A control dependency on the part's call op does not help:
grappler drops it as implied by the data edge, and once inlined only the data edge remains.
So each part is made a unit inside its own body (as_unit): every op it creates waits for its
inputs (which come out of the acquire), and its outputs (which go into the yield) wait for every
stateful op it ran.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import tensorflow as tf

from crossover_tf._nest import map_present
from crossover_tf.lease import DeviceLease


def as_unit(part: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps a function to be traced by tf.function so that its ops start after all its tensor
    inputs exist and its outputs exist only after all its side effects."""

    @functools.wraps(part)
    def unit(*args: Any) -> Any:
        if tf.executing_eagerly():
            return part(*args)
        inputs = [t for t in tf.nest.flatten(args) if isinstance(t, tf.Tensor)]
        with tf.control_dependencies(inputs):
            outputs = part(*args)
        effects = [op for op in tf.compat.v1.get_default_graph().get_operations()
                   if op._is_stateful]
        with tf.control_dependencies(effects):
            return tf.nest.map_structure(
                lambda t: tf.identity(t) if isinstance(t, tf.Tensor) else t, outputs)

    return unit


def run_holding_device(lease: DeviceLease | None, tag: int, part: Callable[..., Any],
                       *args: Any, reserve_s: float = 0.0) -> Any:
    """Returns part(*args) (a tf.function of an as_unit), computed while this process holds
    the lease (None: no lease).

    The acquire passes args through (None entries pass by), the yield passes part's outputs
    through, so a caller that consumes the outputs (a collective) runs with the device free.
    reserve_s: the yield's reservation against lower priority classes (DeviceLease.yield_device).
    """
    if lease is None:
        return part(*args)
    flat_args = tf.nest.flatten(args)
    if all(a is None for a in flat_args):
        raise ValueError("crossover_tf: a leased step needs at least one input tensor")
    flat_args = map_present(lambda ts: lease.acquire(ts, tag=tag), flat_args)
    outputs = part(*tf.nest.pack_sequence_as(args, flat_args))
    return tf.nest.pack_sequence_as(outputs, map_present(
        lambda ts: lease.yield_device(ts, reserve_s=reserve_s), tf.nest.flatten(outputs)))
