"""Weight decay as an L2 kernel penalty, applied after a model is built.

One helper serves every family, including keras.applications models whose
constructors take no regularizer argument.
"""
from __future__ import annotations

import keras


def apply_weight_decay(model: keras.Model, weight_decay: float) -> keras.Model:
    """Adds an L2(weight_decay) penalty to every conv/dense kernel of `model`.

    Biases and BatchNorm parameters are left alone, as in He et al. (2015).
    The layer's `kernel_regularizer` is set too so the penalty shows in its config.
    """
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    if weight_decay == 0:
        return model
    penalty = keras.regularizers.L2(weight_decay)
    for layer in model._flatten_layers(include_self=False):
        kernel = getattr(layer, "kernel", None)
        if isinstance(kernel, keras.Variable) and kernel.trainable:
            layer.kernel_regularizer = penalty
            kernel.regularizer = penalty
    return model
