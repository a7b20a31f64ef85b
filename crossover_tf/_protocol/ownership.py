"""Which rank's step protocol a Keras model belongs to: the one whose strategy.scope() it was
made in, as a tf.distribute strategy owns the variables created in its scope.

Why: MultiWorkerMirroredStrategy needs no callback, so a port that only swaps the strategy line
calls `fit` without strategy.callbacks(), and each rank trained alone, silently. scope() now
records the variables created in it; fit, evaluate and predict (fit_guard) find the owner from
a model's weights and run its crossover steps as callbacks() would. A model made outside every
scope, fit in a process whose job has several ranks or a crossover group, is refused at fit:
it would train this rank alone, or compute beside the peer job without the lease (its evaluate
and predict run on the calling rank, under the lease, as MultiWorkerMirroredStrategy runs them).
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterable, Iterator

import keras
import tensorflow as tf

# A rank's StepProtocol, as Any: step_protocol imports this module (extended's
# variable_created_in_scope), and the runtime keeps no import circle, typing ones included.
StepProtocol = Any

# id of the tf.Variable a variable was created as -> (a weak reference to it, its owner). A
# variable is not hashable, so by id, checked against the reference; a dropped model's
# variables leave with it.
_OWNER: "dict[int, tuple[weakref.ref, StepProtocol]]" = {}
_BROADCAST: set[int] = set()  # the keys of _OWNER that strategy.run broadcast already


def _forget(key: int) -> None:
    _OWNER.pop(key, None)
    _BROADCAST.discard(key)


# Every protocol of this process (one per strategy; in practice one).
_PROTOCOLS: "weakref.WeakSet[StepProtocol]" = weakref.WeakSet()


def register(protocol: StepProtocol) -> None:
    """Makes protocol known, so that a model outside its scope can be refused."""
    _PROTOCOLS.add(protocol)


@contextlib.contextmanager
def owned_by(protocol: StepProtocol) -> Iterator[None]:
    """Records every variable created inside as protocol's (strategy.scope())."""
    def record(next_creator: Any, **kwargs: Any) -> Any:
        variable = next_creator(**kwargs)
        key = id(variable)
        _OWNER[key] = (weakref.ref(variable, lambda _, key=key: _forget(key)), protocol)
        _BROADCAST.discard(key)
        return variable

    with tf.variable_creator_scope(record):
        yield


def _backing(variable: Any) -> Any:
    """The tf.Variable behind a Keras variable (Keras 3 keeps it as `.value`); a tf.Variable
    is its own (its `value` is a method, whose bound object is never the one recorded)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def not_yet_broadcast(protocol: "StepProtocol") -> list[Any]:
    """The live variables protocol's scope made that were not returned here before, in the
    order they were made (the same on every rank of a job running the same code), and marks
    them: strategy.run broadcasts them from rank 0 once, as MultiWorkerMirroredStrategy starts
    every replica from the chief's values."""
    fresh = []
    for key, (ref, owner) in list(_OWNER.items()):
        variable = ref()
        if owner is protocol and variable is not None and key not in _BROADCAST:
            _BROADCAST.add(key)
            fresh.append(variable)
    return fresh


def owner_of_variables(variables: Iterable[Any]) -> StepProtocol | None:
    """The protocol whose scope made any of these variables (None: none did)."""
    for weight in variables:
        variable = _backing(weight)
        entry = _OWNER.get(id(variable))
        if entry is not None and entry[0]() is variable:
            return entry[1]
    return None


def owner_of(model: keras.Model) -> StepProtocol | None:
    """The protocol whose scope made model's weights (None: none did, or it has none yet)."""
    return owner_of_variables(model.weights)


def needing_ownership() -> StepProtocol | None:
    """A protocol of this process under which a model made outside its scope would train
    apart: its job has several ranks, or it crosses with a peer job (None otherwise)."""
    for protocol in _PROTOCOLS:
        if protocol.comm.size > 1 or protocol.is_crossover:
            return protocol
    return None


def outside_scope_message(kind: str) -> str:
    """What a refused fit or train_on_batch says, and the two fixes (evaluate and predict of
    such a model run on the calling rank: fit_guard)."""
    return (f"crossover_tf: this model was not made under strategy.scope(), so its {kind} "
            "would run on this rank alone: with several ranks it trains apart from the job's "
            "other ranks, and in a crossover group it computes beside the peer job without the "
            "device lease. Create (and compile) the model inside `with strategy.scope():`, as "
            "with MultiWorkerMirroredStrategy (fit then crosses and synchronises by itself), "
            "or pass callbacks=strategy.callbacks() to fit (strategy.prepare(model) before "
            "train_on_batch)")
