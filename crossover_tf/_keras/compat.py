"""Every use of Keras internals, in one place.

The crossover steps replace Keras' train step and rebuild its functions, which needs a few
private Keras symbols (below). Any Keras minor release may rename them, so pyproject.toml pins the
range the tests cover (SUPPORTED_KERAS) and this module checks at import that the symbols are
there: a clear error naming the installed version instead of an AttributeError mid-fit.
Attributes that Keras sets per model instance are checked when a model is hooked
(check_model). Nothing else in crossover_tf touches `keras.src` or a `model._*` attribute.
"""
from __future__ import annotations

import contextlib
import importlib
from typing import Any, Iterator

import keras

# pyproject.toml's pin; tests/unit/test_keras_compat.py keeps them equal.
SUPPORTED_KERAS = ">=3.15.1,<3.16"
MODULE_SYMBOLS = {"keras.src.losses.loss": ("unscale_loss_for_distribution",)}
MODEL_METHODS = ("_symbolic_build", "_compute_loss")  # on the keras.Model class
MODEL_ATTRIBUTES = ("_jit_compile", "_call_has_training_arg", "_loss_tracker")  # per instance


class UnsupportedKerasError(ImportError):
    """The installed Keras lacks an internal symbol crossover_tf relies on."""


def _unsupported(missing: list[str]) -> UnsupportedKerasError:
    return UnsupportedKerasError(
        f"crossover_tf: Keras {keras.__version__} lacks {', '.join(missing)}; crossover_tf "
        f"supports keras{SUPPORTED_KERAS} (pip install 'keras{SUPPORTED_KERAS}')")


def check_keras() -> None:
    """Raises UnsupportedKerasError unless Keras has the private functions and methods used
    here."""
    missing = []
    for module_name, names in MODULE_SYMBOLS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            missing.append(module_name)
            continue
        missing += [f"{module_name}.{name}" for name in names if not hasattr(module, name)]
    missing += [f"keras.Model.{name}" for name in MODEL_METHODS
                if not hasattr(keras.Model, name)]
    if missing:
        raise _unsupported(missing)


def check_model(model: keras.Model) -> None:
    """Raises UnsupportedKerasError unless a compiled model has the private attributes used
    here (Keras sets them in __init__ and compile, so a class cannot be asked)."""
    missing = [f"keras.Model.{name}" for name in MODEL_ATTRIBUTES
               if not hasattr(model, name)]
    if missing:
        raise _unsupported(missing)


check_keras()
from keras.src.losses.loss import unscale_loss_for_distribution  # noqa: E402  (checked above)


def build_from_batch(model: keras.Model, data: Any) -> None:
    """Builds layers, compiled metrics and loss from a batch, as Keras does on its first
    traced step (which is too late for the crossover steps)."""
    model._symbolic_build(data_batch=data)


def call_training(model: keras.Model, x: Any) -> Any:
    """The forward pass in training mode, passing training=True only where call() takes it."""
    return model(x, training=True) if model._call_has_training_arg else model(x)


def compute_loss(model: keras.Model, x: Any, y: Any, y_pred: Any, sample_weight: Any) -> Any:
    """The compiled loss (plus regularisation losses) of one training batch."""
    return model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                               training=True)


def track_loss(model: keras.Model, loss: Any, batch_size: Any) -> None:
    """Adds a batch's loss to the `loss` metric fit reports, as Keras' own train step does."""
    model._loss_tracker.update_state(unscale_loss_for_distribution(loss),
                                     sample_weight=batch_size)


def loss_tracker(model: keras.Model) -> Any:
    """The loss metric (a new one per compile; None before compile)."""
    return getattr(model, "_loss_tracker", None)


@contextlib.contextmanager
def jit_compile_off(model: keras.Model) -> Iterator[None]:
    """Switches the model's jit_compile off, then back, without the property's setter (which
    warns and may change the setting): only the outer step function is made jit-free."""
    saved = model.jit_compile
    model._jit_compile = False
    try:
        yield
    finally:
        model._jit_compile = saved
