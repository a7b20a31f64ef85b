"""CIFAR ResNet v1 (He et al. 2015, section 4.2): 6n+2 layers, three stages of 16/32/64 filters.

Shortcuts are parameter-free (option A: subsample and zero-pad channels), as in the paper,
so ResNet-20 has ~0.27M and ResNet-56 ~0.85M parameters.
"""
from __future__ import annotations

from collections.abc import Sequence

import keras

from models.regularization import apply_weight_decay


@keras.saving.register_keras_serializable(package="crossover_tf")
class ZeroPadShortcut(keras.layers.Layer):
    """Option-A shortcut: spatial stride-2 subsampling plus zero channels up to `filters`."""

    def __init__(self, filters: int, **kwargs):
        super().__init__(**kwargs)
        self.filters = filters

    def call(self, x):
        x = x[:, ::2, ::2, :]
        extra = self.filters - x.shape[-1]
        return keras.ops.pad(x, [[0, 0], [0, 0], [0, 0], [extra // 2, extra - extra // 2]])

    def compute_output_shape(self, input_shape):
        batch, height, width, _ = input_shape
        return (batch, _half(height), _half(width), self.filters)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters}


def _half(n: int | None) -> int | None:
    """Spatial size after a stride-2 layer with 'same' padding (None stays unknown)."""
    return None if n is None else (n + 1) // 2


def _conv_bn(x, filters: int, strides: int, relu: bool):
    x = keras.layers.Conv2D(filters, 3, strides=strides, padding="same", use_bias=False,
                            kernel_initializer="he_normal")(x)
    x = keras.layers.BatchNormalization()(x)
    return keras.layers.ReLU()(x) if relu else x


def _basic_block(x, filters: int, strides: int):
    shortcut = x if strides == 1 and x.shape[-1] == filters else ZeroPadShortcut(filters)(x)
    y = _conv_bn(x, filters, strides, relu=True)
    y = _conv_bn(y, filters, 1, relu=False)
    return keras.layers.ReLU()(keras.layers.Add()([shortcut, y]))


def build_resnet_cifar(
    input_shape: Sequence[int],
    num_classes: int,
    *,
    depth: int,
    width: int = 16,
    weight_decay: float = 1e-4,
) -> keras.Model:
    """ResNet-`depth` v1 for small images; depth must be 6n+2. Outputs logits."""
    if depth < 8 or (depth - 2) % 6:
        raise ValueError(f"CIFAR ResNet depth must be 6n+2 (20, 32, 44, 56, 110, ...), got {depth}")
    blocks_per_stage = (depth - 2) // 6
    inputs = keras.Input(shape=tuple(input_shape), name="images")
    x = _conv_bn(inputs, width, 1, relu=True)
    for stage, filters in enumerate((width, 2 * width, 4 * width)):
        for block in range(blocks_per_stage):
            x = _basic_block(x, filters, strides=2 if stage > 0 and block == 0 else 1)
    x = keras.layers.GlobalAveragePooling2D()(x)
    logits = keras.layers.Dense(num_classes, name="logits")(x)
    model = keras.Model(inputs, logits, name=f"resnet{depth}")
    return apply_weight_decay(model, weight_decay)


def build_resnet20(input_shape: Sequence[int], num_classes: int, **kwargs) -> keras.Model:
    """ResNet-20 (n=3), ~0.27M parameters."""
    return build_resnet_cifar(input_shape, num_classes, depth=20, **kwargs)


def build_resnet56(input_shape: Sequence[int], num_classes: int, **kwargs) -> keras.Model:
    """ResNet-56 (n=9), ~0.85M parameters."""
    return build_resnet_cifar(input_shape, num_classes, depth=56, **kwargs)
