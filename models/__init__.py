"""Registry of the Keras models the experiments train.

Every builder is `build_<name>(input_shape, num_classes, **kwargs) -> keras.Model`, returns
logits (train with `from_logits=True`), does no I/O, and is deterministic after
`keras.utils.set_random_seed`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import keras

from models.imagenet import build_resnet50, build_vgg16
from models.resnet_cifar import build_resnet20, build_resnet56
from models.small_cnn import build_mlp, build_small_cnn

ModelBuilder = Callable[..., keras.Model]

_BUILDERS: dict[str, ModelBuilder] = {
    "mlp": build_mlp,
    "small_cnn": build_small_cnn,
    "resnet20": build_resnet20,
    "resnet56": build_resnet56,
    "resnet50": build_resnet50,
    "vgg16": build_vgg16,
}


def available_models() -> list[str]:
    """Names accepted by `get_builder` / `build_model`, sorted."""
    return sorted(_BUILDERS)


def get_builder(name: str) -> ModelBuilder:
    """The builder registered as `name`; ValueError listing the choices otherwise."""
    try:
        return _BUILDERS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown model {name!r}; choose one of: {', '.join(available_models())}") from None


def build_model(name: str, input_shape: Sequence[int], num_classes: int, **kwargs) -> keras.Model:
    """Builds model `name` for `input_shape` images and `num_classes` classes."""
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    return get_builder(name)(tuple(input_shape), num_classes, **kwargs)
