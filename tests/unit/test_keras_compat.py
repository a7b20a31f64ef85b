"""crossover_tf._keras.compat: a Keras without the internals it uses is refused with the
installed version and the supported range, and the range is the one pyproject.toml pins."""
from __future__ import annotations

import importlib
import importlib.util
import types

import keras
import pytest
from packaging.specifiers import SpecifierSet

from conftest import REPO_ROOT
from crossover_tf._keras import compat as keras_compat

def _defining_class(name: str) -> type:
    return next(c for c in keras.Model.__mro__ if name in vars(c))


@pytest.mark.parametrize("name", keras_compat.MODEL_METHODS)
def test_missing_model_method_is_named_with_the_version(monkeypatch, name):
    monkeypatch.delattr(_defining_class(name), name)
    with pytest.raises(keras_compat.UnsupportedKerasError, match=f"keras.Model.{name}") as err:
        keras_compat.check_keras()
    assert keras.__version__ in str(err.value) and keras_compat.SUPPORTED_KERAS in str(err.value)


def test_missing_module_function_is_named_with_the_version(monkeypatch):
    monkeypatch.delattr("keras.src.losses.loss.unscale_loss_for_distribution")
    with pytest.raises(keras_compat.UnsupportedKerasError,
                       match=f"Keras {keras.__version__} lacks keras.src.losses.loss."
                             "unscale_loss_for_distribution"):
        keras_compat.check_keras()


def test_installed_keras_passes():
    keras_compat.check_keras()


def test_importing_the_module_runs_the_check(monkeypatch):
    """The check runs when crossover_tf is imported, before any model is built."""
    monkeypatch.delattr(_defining_class("_compute_loss"), "_compute_loss")
    try:
        with pytest.raises(ImportError, match=f"Keras {keras.__version__} lacks "
                                              "keras.Model._compute_loss"):
            importlib.reload(keras_compat)
    finally:
        monkeypatch.undo()
        importlib.reload(keras_compat)


def test_model_without_an_instance_attribute_is_refused():
    present = {name: None for name in keras_compat.MODEL_ATTRIBUTES[1:]}
    missing = keras_compat.MODEL_ATTRIBUTES[0]
    with pytest.raises(keras_compat.UnsupportedKerasError, match=f"lacks keras.Model.{missing};"):
        keras_compat.check_model(types.SimpleNamespace(**present))


def test_compiled_model_has_the_instance_attributes():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    keras_compat.check_model(model)
    with keras_compat.jit_compile_off(model):
        assert model.jit_compile is False
    assert model.jit_compile is True and keras_compat.loss_tracker(model) is not None


def test_pyproject_pins_the_supported_range_and_it_is_installed():
    spec = importlib.util.spec_from_file_location("pins", REPO_ROOT / "scripts" / "pins.py")
    pins = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pins)
    assert pins.all_requirements()["keras"] == f"keras{keras_compat.SUPPORTED_KERAS}"
    assert keras.__version__ in SpecifierSet(keras_compat.SUPPORTED_KERAS)
