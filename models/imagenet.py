"""ImageNet-shaped models from keras.applications, randomly initialised (weights=None: no download).

VGG-16 (138M parameters, most in dense layers) is the communication-heavy case;
ResNet-50 (25.6M) the compute-heavy one.
"""
from __future__ import annotations

from collections.abc import Sequence

import keras

from models.regularization import apply_weight_decay


def _application(constructor, input_shape: Sequence[int], num_classes: int,
                 weight_decay: float) -> keras.Model:
    model = constructor(weights=None, input_shape=tuple(input_shape), classes=num_classes,
                        classifier_activation=None)
    return apply_weight_decay(model, weight_decay)


def build_resnet50(input_shape: Sequence[int], num_classes: int, *,
                   weight_decay: float = 0.0) -> keras.Model:
    """ResNet-50 v1 (keras.applications). Outputs logits."""
    return _application(keras.applications.ResNet50, input_shape, num_classes, weight_decay)


def build_vgg16(input_shape: Sequence[int], num_classes: int, *,
                weight_decay: float = 0.0) -> keras.Model:
    """VGG-16 with its 4096-wide dense head (keras.applications). Outputs logits."""
    return _application(keras.applications.VGG16, input_shape, num_classes, weight_decay)
