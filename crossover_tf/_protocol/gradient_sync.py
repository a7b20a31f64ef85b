"""Whether this step synchronised its gradients over the job's ranks: every allreduce of
gradients notes it here, and an optimizer update of a multi-rank job's variables is refused
without it (optimizer_guard).

Why: a custom loop that uses a plain tf.GradientTape and optimizer.apply_gradients outside
strategy.run (a Horovod loop without DistributedGradientTape, a tf.distribute loop that skipped
strategy.run) updates each rank's weights with its own gradients: the ranks train apart, and
the loss, reduced over them, looks normal. The note is per traced graph (a tf.function, with
the functions it calls nested: the Keras step applies in a nested function of the graph that
reduced) or, run eagerly, per rank's protocol once it has reduced.
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Iterator

import tensorflow as tf

_GRAPHS: "weakref.WeakSet[Any]" = weakref.WeakSet()  # graphs that reduce their gradients
_EAGER: "weakref.WeakSet[Any]" = weakref.WeakSet()   # protocols that did, run eagerly
_local = threading.local()


@contextlib.contextmanager
def reduced_by_the_step() -> Iterator[None]:
    """The optimizer update inside applies gradients the caller reduced itself: the Keras
    step's apply, a tf.function of its own that is traced (and XLA-compiled) apart from the
    function that reduces, before it."""
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    try:
        yield
    finally:
        _local.depth = depth


def note_synchronized(protocol: Any) -> None:
    """This step (the graph being traced, or the protocol run eagerly) reduces its gradients."""
    if tf.executing_eagerly():
        _EAGER.add(protocol)
    else:
        _GRAPHS.add(tf.compat.v1.get_default_graph())


def synchronized_here(protocol: Any) -> bool:
    """Whether the code running now reduced its gradients: in the graph being traced or a graph
    it is nested in; eagerly, whether the protocol ever did; inside reduced_by_the_step."""
    if getattr(_local, "depth", 0):
        return True
    if tf.executing_eagerly():
        return protocol in _EAGER
    graph = tf.compat.v1.get_default_graph()
    while graph is not None:
        if graph in _GRAPHS:
            return True
        graph = getattr(graph, "outer_graph", None)
    return False
