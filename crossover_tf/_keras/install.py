"""Makes one model instance's fit, evaluate and predict run crossover steps.

Keras makes its train/test/predict functions from `model.<kind>_step` in
`make_<kind>_function`. Both are shadowed by instance attributes: Keras' own maker is reused
with the outer function's jit switched off (lease ops and collectives have no XLA kernels; the
steps jit-compile their nested parts with the model's setting) and our step in place of Keras'.

A step is built again whenever Keras makes its function again (every compile) or the optimizer,
loss tracker or trainable variables changed since it was built: its nested tf.functions keep
what they were traced with, so reusing one would train a stale optimizer or trainable set.
"""
from __future__ import annotations

from typing import Any, Callable

import keras

from crossover_tf._keras import compat as keras_compat
from crossover_tf._keras import first_step
from crossover_tf._keras.evaluate_average import average_evaluate
from crossover_tf._keras.inference_step import LeasedInferenceStep
from crossover_tf._keras.step_errors import leave_on_error
from crossover_tf._keras.train_step import CrossoverTrainStep
from crossover_tf._protocol.step_protocol import StepProtocol

StepFunction = Callable[[Any], Any]
Step = Callable[[Any], Any]
_INSTALLED = "_crossover_hooks"  # the model's (protocol, micro_batches)
_ON_THIS_RANK = "_crossover_inference_on_this_rank"  # the protocol install_on_this_rank used


def installed_protocol(model: keras.Model) -> StepProtocol | None:
    """The protocol install() put on model (None: it has no crossover hooks)."""
    installed = model.__dict__.get(_INSTALLED)
    return installed[0] if installed else None


def micro_batches_of(model: keras.Model) -> int:
    """The micro-batches model's train step computes in (1 without crossover hooks)."""
    installed = model.__dict__.get(_INSTALLED)
    return installed[1] if installed else 1


def install(model: keras.Model, protocol: StepProtocol, micro_batches: int = 1) -> None:
    """Hooks fit (and, with a lease, evaluate and predict); idempotent per (model, protocol,
    micro_batches). micro_batches was checked where it was given (options)."""
    if model.__dict__.get(_INSTALLED) == (protocol, micro_batches):
        return
    if model.optimizer is None:
        raise ValueError("crossover_tf: compile the model (with an optimizer) before fit")
    keras_compat.check_model(model)
    object.__setattr__(model, _INSTALLED, (protocol, micro_batches))

    def train_function(function: StepFunction, step: CrossoverTrainStep) -> StepFunction:
        prepared = first_step.PreparedFunction(function, first_step.before_training(step))
        return leave_on_error(prepared, protocol, step.jit_compile, "training")

    _hook(model, "train", lambda m: CrossoverTrainStep(m, protocol, micro_batches),
          train_function)
    if protocol.comm.size > 1:
        average_evaluate(model, protocol)
    if protocol.is_crossover:
        _hook_inference(model, protocol)


def install_on_this_rank(model: keras.Model, protocol: StepProtocol) -> None:
    """Makes evaluate and predict (and their one-batch forms) of a model with no crossover
    steps (one loaded from a file outside every scope, or not compiled) take protocol's lease
    step by step, on this rank alone: as MultiWorkerMirroredStrategy runs a model made outside
    its scope on the worker that calls it, so rank 0 may predict alone, while in a crossover
    group no step computes beside the peer without the lease. No collective (metrics stay this
    rank's) and no train step: fit on such a model is still refused (fit_guard)."""
    if model.__dict__.get(_ON_THIS_RANK) is protocol:
        return
    object.__setattr__(model, _ON_THIS_RANK, protocol)
    _hook_inference(model, protocol)


def _hook_inference(model: keras.Model, protocol: StepProtocol) -> None:
    """Each test and predict step holds the lease (LeasedInferenceStep), prepared as its
    first batch needs (first_step.before_inference) and left for good on an error."""
    def inference_function(kind: str) -> Callable[[StepFunction, Any], StepFunction]:
        def wrap(function: StepFunction, step: LeasedInferenceStep) -> StepFunction:
            prepared = first_step.PreparedFunction(
                function, first_step.before_inference(step, build=kind == "test"))
            return leave_on_error(prepared, protocol, step.jit_compile, kind)
        return wrap

    for kind in ("test", "predict"):
        _hook(model, kind, lambda m, kind=kind: LeasedInferenceStep(m, protocol, kind),
              inference_function(kind))


def _hook(model: keras.Model, kind: str, make_step: Callable[[keras.Model], Step],
          wrap: Callable[[StepFunction, Any], StepFunction]) -> None:
    """Shadows model.make_<kind>_function; a fresh wrapper per fit/evaluate/predict call."""
    keras_make = getattr(type(model), f"make_{kind}_function")
    attr = f"{kind}_function"
    built: dict[str, Any] = {}

    def make_function(force: bool = False) -> StepFunction:
        fingerprint = _compiled_state(model)
        if force or getattr(model, attr) is None or built.get("fingerprint") != fingerprint:
            step = make_step(model)
            object.__setattr__(model, f"{kind}_step", step)
            with keras_compat.jit_compile_off(model):
                keras_make(model, force=True)
            built.update(fingerprint=fingerprint, step=step, function=getattr(model, attr))
        setattr(model, attr, wrap(built["function"], built["step"]))
        return getattr(model, attr)

    object.__setattr__(model, f"make_{kind}_function", make_function)
    setattr(model, attr, None)


def _compiled_state(model: keras.Model) -> tuple[int, ...]:
    """Identity of what a step's traces capture: optimizer, loss tracker (new per compile) and
    the trainable variables."""
    return (id(model.optimizer), id(keras_compat.loss_tracker(model)),
            *(id(v) for v in model.trainable_weights))
