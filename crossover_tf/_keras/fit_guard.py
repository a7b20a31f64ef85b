"""fit, evaluate and predict (and their one-batch forms, train_on_batch, test_on_batch and
predict_on_batch) as a tf.distribute user expects them: a model made under
strategy.scope() crosses and synchronises with no callback, a model made outside is refused
where it would train apart (fit, train_on_batch) but evaluates and predicts on the calling
rank alone, under the lease; file-writing callbacks given to every rank write the chief's files
only (rank_files); and a fit that ends any way at all ends out of the link turn and without
the device.

Why the class: Keras 3's fit has no `finally`, so an error raised by a callback, or a Ctrl-C
between steps, skips both on_train_end and the step function's guard (step_errors), and the
peer job would wait for our link turn (up to LinkTurnOptions.wait_s) on every allreduce for as
long as this process lives, as a notebook's kernel does. Our hooks are installed from inside
fit (Keras calls set_model while fit builds its callbacks), too late to wrap the call already
running; the class's methods are wrapped before the first one starts. Which model belongs to
which rank's protocol: _protocol.ownership.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import keras
import tensorflow as tf
from absl import logging

from crossover_tf import callbacks as crossover_callbacks
from crossover_tf._protocol import datasets
from crossover_tf._protocol import ownership
from crossover_tf._keras import first_step, rank_files
from crossover_tf._keras.install import install, install_on_this_rank, installed_protocol

_GUARDED = "_crossover_guarded"


def guard_fit(model_class: type = keras.Model) -> None:
    """Wraps model_class.fit, evaluate and predict, and their one-batch forms train_on_batch,
    test_on_batch and predict_on_batch (once per process); models without an owner in a
    process with no distributed job are untouched."""
    if getattr(model_class.fit, _GUARDED, False):
        return
    model_class.fit = _guarded(model_class.fit, _fit)
    for name in ("evaluate", "predict", "test_on_batch", "predict_on_batch"):
        setattr(model_class, name, _guarded(getattr(model_class, name), _inference(name)))
    model_class.train_on_batch = _guarded(model_class.train_on_batch, _train_on_batch)


def _guarded(method: Callable[..., Any], run: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(model: keras.Model, *args: Any, **kwargs: Any) -> Any:
        return run(method, model, *args, **kwargs)

    setattr(wrapper, _GUARDED, True)
    return wrapper


def _fit(fit: Callable[..., Any], model: keras.Model, *args: Any, **kwargs: Any) -> Any:
    """fit with the owner's crossover callbacks added when none were given, then left for
    good however it ends."""
    bound = inspect.signature(fit).bind(model, *args, **kwargs)
    given = list(bound.arguments.get("callbacks") or [])
    crossing = [c.protocol for c in given
                if isinstance(c, crossover_callbacks.CrossoverTrainStepCallback)]
    if not crossing:
        owner = ownership.owner_of(model)
        if owner is not None:
            bound.arguments["callbacks"] = [*given, *crossover_callbacks.for_fit(owner)]
            _split_like_mirrored(bound.arguments, owner)
            crossing = [owner]
        elif installed_protocol(model) is None and ownership.needing_ownership() is not None:
            raise ValueError(ownership.outside_scope_message("fit"))
    rank = crossing[0].comm.rank if crossing else 0
    try:
        with rank_files.written_by_the_chief(given, rank):
            return fit(*bound.args, **bound.kwargs)
    finally:
        protocol = installed_protocol(model)
        if protocol is not None:
            protocol.leave()


def _train_on_batch(train_on_batch: Callable[..., Any], model: keras.Model, *args: Any,
                    **kwargs: Any) -> Any:
    """train_on_batch with the owner's crossover step installed, as fit's first call would
    install it (its lease, allreduce and first-call broadcast); refused, as fit is, for a
    model made outside every scope in a job whose ranks or peer it would train apart from.
    Keras's own train_on_batch skips fit, so without this a model made in scope trained each
    rank alone, beside the peer job, with no lease."""
    if installed_protocol(model) is None:
        owner = _install_owned(model)
        if owner is None and ownership.needing_ownership() is not None:
            raise ValueError(ownership.outside_scope_message("train_on_batch"))
    with first_step.one_batch_step():
        return train_on_batch(model, *args, **kwargs)


def _install_owned(model: keras.Model) -> Any:
    """Installs the owner's crossover steps on a compiled model made in a strategy's scope,
    as strategy.prepare would; returns the owner (None: made outside every scope)."""
    owner = ownership.owner_of(model)
    if owner is not None and getattr(model, "optimizer", None) is not None:
        install(model, owner)
    return owner


def _split_like_mirrored(arguments: dict[str, Any], owner: Any) -> None:
    """As MultiWorkerMirroredStrategy's fit does, each rank trains on its slice of every
    global batch of a tf.data dataset given whole (not one rank's already: _protocol.datasets),
    and validates on its slice of the validation data's. Only where fit added the callbacks
    itself: a script that passes strategy.callbacks() distributes its data itself."""
    size, rank = owner.comm.size, owner.comm.rank
    if size == 1:
        return
    for name in ("x", "validation_data"):
        data = arguments.get(name)
        if isinstance(data, tf.data.Dataset) and not datasets.is_per_rank(data):
            arguments[name] = datasets.split_global_batches(data, rank, size, contiguous=True)
            logging.info("crossover_tf: fit's %s split across the %d ranks (each its slice of "
                         "every global batch), as MultiWorkerMirroredStrategy's fit does", name,
                         size)


def _inference(kind: str) -> Callable[..., Any]:
    def run(method: Callable[..., Any], model: keras.Model, *args: Any, **kwargs: Any) -> Any:
        """evaluate/predict with the owner's steps (the lease, averaged metrics) installed as
        strategy.prepare would, else on this rank alone (_on_this_rank)."""
        if installed_protocol(model) is None:
            owner = _install_owned(model)
            if installed_protocol(model) is None:
                _on_this_rank(model, owner)
        return method(model, *args, **kwargs)
    return run


def _on_this_rank(model: keras.Model, owner: Any) -> None:
    """A model without the owner's steps (made outside every scope, a loaded checkpoint, or
    not compiled) evaluates and predicts on the calling rank alone, as under
    MultiWorkerMirroredStrategy: nothing there trains apart from the other ranks, so it is not
    refused as fit is; in a crossover group each step takes the lease (install_on_this_rank),
    never computing beside the peer without it."""
    crossing = owner if owner is not None else ownership.needing_ownership()
    if crossing is not None and crossing.is_crossover:
        install_on_this_rank(model, crossing)
