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

import dataclasses
import functools
import re
from typing import Any, Callable

import keras
import tensorflow as tf

from crossover_tf._keras import first_step
from crossover_tf._keras import compat as keras_compat
from crossover_tf._setup.extended import CrossoverExtended
from crossover_tf._keras.inference_step import LeasedInferenceStep
from crossover_tf.lease import DeviceLease, LinkTurn
from crossover_tf._keras.train_step import Allreduce, CrossoverTrainStep

_XLA_FAILURE = re.compile(r"XLA|compil", re.IGNORECASE)
_XLA_ERROR_TYPES = (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError)

StepFunction = Callable[[Any], Any]
Step = Callable[[Any], Any]


@dataclasses.dataclass(frozen=True)
class CrossoverSetup:
    """What the steps need from the strategy (and nothing else of it): the rank's one state,
    shared and never copied, and how this model's steps run."""
    state: CrossoverExtended
    allreduce: Allreduce
    sync_state: first_step.SyncState | None  # None: one rank, nothing to broadcast
    micro_batches: int = 1  # >1: compute under one hold per micro-batch (priority mode)
    # Averages a dict of scalars over the job's ranks (None: one rank); evaluate returns it.
    average_logs: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    @property
    def lease(self) -> DeviceLease | None:
        return self.state.lease

    @property
    def turn(self) -> LinkTurn | None:
        """The allreduce order among the group's jobs (None: no link turns)."""
        return self.state.link_turn

    @property
    def step_end_reserve_s(self) -> float:
        """The step-end yield's reservation (a primary's)."""
        return self.state.step_end_reserve_s


def installed_setup(model: keras.Model) -> CrossoverSetup | None:
    """The setup install() put on model (None: it has no crossover hooks)."""
    return model.__dict__.get("_crossover_setup")


def install(model: keras.Model, setup: CrossoverSetup) -> None:
    """Hooks fit (and, with a lease, evaluate and predict); idempotent per (model, setup)."""
    if installed_setup(model) == setup:
        return
    if model.optimizer is None:
        raise ValueError("crossover_tf: compile the model (with an optimizer) before fit")
    keras_compat.check_model(model)
    object.__setattr__(model, "_crossover_setup", setup)

    def train_step(m: keras.Model) -> CrossoverTrainStep:
        return CrossoverTrainStep(m, setup.lease, setup.allreduce, m.jit_compile,
                                  setup.micro_batches, setup.step_end_reserve_s, setup.turn)

    def train_function(function: StepFunction, step: CrossoverTrainStep) -> StepFunction:
        prepared = first_step.PreparedFunction(
            function, first_step.before_training(step, setup.sync_state))
        return _leave_on_error(prepared, setup, step.jit_compile, "training")

    def inference_function(kind: str) -> Callable[[StepFunction, Any], StepFunction]:
        def wrap(function: StepFunction, step: LeasedInferenceStep) -> StepFunction:
            prepared = first_step.PreparedFunction(
                function, first_step.before_inference(step, build=kind == "test"))
            return _leave_on_error(prepared, setup, step.jit_compile, kind)
        return wrap

    _hook(model, "train", train_step, train_function)
    if setup.average_logs is not None:
        _average_evaluate(model, setup.average_logs)
    if setup.lease is None:
        return
    for kind in ("test", "predict"):
        _hook(model, kind, lambda m, kind=kind: LeasedInferenceStep(m, setup.lease, kind),
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


def _average_evaluate(model: keras.Model,
                      average: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Shadows model.evaluate so that every rank returns the job's metrics, averaged over the
    ranks as fit's epoch logs are (MetricAverage), in the form Keras returns: a scalar, a list
    or, with return_dict=True, a dict. Each rank evaluates its own shard (and BatchNorm's
    moving statistics are per rank), so without this two ranks report different numbers for
    one model. A collective: every rank must call evaluate, as every rank calls fit."""
    keras_evaluate = type(model).evaluate

    @functools.wraps(keras_evaluate)
    def evaluate(*args: Any, **kwargs: Any) -> Any:
        result = keras_evaluate(model, *args, **kwargs)
        if isinstance(result, dict):
            return average(result)
        values = result if isinstance(result, list) else [result]
        averaged = average({str(i): v for i, v in enumerate(values)})
        values = [averaged[str(i)] for i in range(len(values))]
        return values if isinstance(result, list) else values[0]

    object.__setattr__(model, "evaluate", evaluate)


def _compiled_state(model: keras.Model) -> tuple[int, ...]:
    """Identity of what a step's traces capture: optimizer, loss tracker (new per compile) and
    the trainable variables."""
    return (id(model.optimizer), id(keras_compat.loss_tracker(model)),
            *(id(v) for v in model.trainable_weights))


def _leave_on_error(function: StepFunction, setup: CrossoverSetup, jit_compile: bool,
                      what: str) -> StepFunction:
    """Never leave the device leased (or the peer waiting for our turn) after a step that
    failed; explain XLA compile failures."""

    def guarded(iterator: Any) -> Any:
        try:
            return function(iterator)
        except StopIteration:
            raise
        except tf.errors.OpError as err:
            leave(setup.lease, setup.turn)
            if (jit_compile and isinstance(err, _XLA_ERROR_TYPES)
                    and _XLA_FAILURE.search(err.message or "")):
                raise RuntimeError(
                    f"crossover_tf: XLA could not compile the model's {what} computation "
                    "(model.compile(jit_compile=True)). Compile the model with "
                    "jit_compile=False (or 'auto', which lets Keras decide), or replace the "
                    f"unsupported op. TensorFlow said: {err.message[:2000]}") from err
            raise
        except BaseException:
            leave(setup.lease, setup.turn)
            raise

    return guarded


def leave(lease: DeviceLease | None, turn: LinkTurn | None) -> None:
    """Gives up the device and leaves the link turn (each if there is one), for good: a turn
    left for a pause (the last epoch's end) is not resumed by the next fit's first epoch, which
    would join before that fit's broadcast and compile; it joins at its first step instead."""
    try:
        if turn is not None:
            turn.leave()
    finally:  # an error leaving the turn must not keep the device from the peer job
        if lease is not None:
            lease.yield_device()


def guard_fit(model_class: type = keras.Model) -> None:
    """Makes model_class.fit (once per process) end out of the link turn and without the
    device, however it ends, for models with crossover hooks installed; others are untouched.

    Why: Keras 3's fit has no `finally`, so an error raised by a callback, or a Ctrl-C between
    steps, skips both on_train_end and the train function's guard, and the peer job would
    wait for our turn (up to LinkTurnOptions.wait_s) on every allreduce for as long as this process
    lives, as a notebook's kernel does. Why the class: our hooks are installed from inside fit
    (Keras calls set_model while fit builds its callbacks), too late to wrap the call already
    running; the class's fit is wrapped before the first one starts.
    """
    fit = model_class.fit
    if getattr(fit, "_crossover_guarded", False):
        return

    @functools.wraps(fit)
    def fit_then_leave(model: keras.Model, *args: Any, **kwargs: Any) -> Any:
        try:
            return fit(model, *args, **kwargs)
        finally:
            setup = installed_setup(model)
            if setup is not None:
                leave(setup.lease, setup.turn)

    fit_then_leave._crossover_guarded = True
    model_class.fit = fit_then_leave
