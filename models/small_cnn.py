"""Small MNIST-sized models: exact data-parallel semantics (no BatchNorm, no Dropout).

Without per-batch statistics or random masks, one step on the global batch equals the
averaged gradients of the per-rank local batches, which the strategy's tests rely on.
"""
from __future__ import annotations

from collections.abc import Sequence

import keras

from models.regularization import apply_weight_decay


def build_small_cnn(
    input_shape: Sequence[int],
    num_classes: int,
    *,
    width: int = 32,
    weight_decay: float = 0.0,
) -> keras.Model:
    """Two 3x3 conv + max-pool stages (width, 2*width filters), then a linear classifier.

    With the defaults on 28x28x1 / 10 classes this is Keras' MNIST convnet (34,826 params).
    Outputs logits.
    """
    inputs = keras.Input(shape=tuple(input_shape), name="images")
    x = inputs
    for filters in (width, 2 * width):
        x = keras.layers.Conv2D(filters, 3, activation="relu")(x)
        x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Flatten()(x)
    logits = keras.layers.Dense(num_classes, name="logits")(x)
    return apply_weight_decay(keras.Model(inputs, logits, name="small_cnn"), weight_decay)


def build_mlp(
    input_shape: Sequence[int],
    num_classes: int,
    *,
    width: int = 32,
    weight_decay: float = 0.0,
) -> keras.Model:
    """Flatten -> Dense(width, relu) -> Dense(num_classes): the model for multi-process tests."""
    inputs = keras.Input(shape=tuple(input_shape), name="images")
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(width, activation="relu")(x)
    logits = keras.layers.Dense(num_classes, name="logits")(x)
    return apply_weight_decay(keras.Model(inputs, logits, name="mlp"), weight_decay)
