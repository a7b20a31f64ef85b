"""Model registry and builders: shapes, parameter counts, determinism, XLA training."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import models  # noqa: E402
from experiments.datasets import load_dataset  # noqa: E402

MNIST, CIFAR, IMAGENET = (28, 28, 1), (32, 32, 3), (224, 224, 3)


def test_registry_lists_every_model():
    assert models.available_models() == sorted(
        ["mlp", "small_cnn", "resnet20", "resnet56", "resnet50", "vgg16"])
    for name in models.available_models():
        assert callable(models.get_builder(name))


@pytest.mark.parametrize("call", [
    lambda: models.get_builder("resnet18"),
    lambda: models.build_model("resnet18", CIFAR, 10),
])
def test_unknown_model_names_the_choices(call):
    with pytest.raises(ValueError, match=r"'resnet18'.*resnet20, resnet50, resnet56, small_cnn"):
        call()


def test_too_few_classes_is_rejected():
    with pytest.raises(ValueError, match="num_classes"):
        models.build_model("mlp", MNIST, 1)


@pytest.mark.parametrize("name, shape, params", [
    ("mlp", MNIST, 25_450),
    ("small_cnn", MNIST, 34_826),  # Keras' MNIST convnet
    ("resnet20", CIFAR, 271_098),  # He et al.: 0.27M
    ("resnet56", CIFAR, 857_082),  # He et al.: 0.85M
])
def test_small_model_parameters_and_logits_shape(name, shape, params):
    model = models.build_model(name, shape, 10)
    assert model.count_params() == params
    assert model(np.zeros((2, *shape), np.float32)).shape == (2, 10)


@pytest.mark.slow
@pytest.mark.parametrize("name, params", [("resnet50", 25_636_712), ("vgg16", 138_357_544)])
def test_imagenet_model_parameters(name, params):
    model = models.build_model(name, IMAGENET, 1000)
    assert model.count_params() == params
    assert model.output.shape == (None, 1000)
    assert model.layers[-1].get_config()["activation"] == "linear"  # logits, like the others
    keras.backend.clear_session()


def test_resnet_depth_must_be_6n_plus_2():
    from models.resnet_cifar import build_resnet_cifar
    with pytest.raises(ValueError, match="6n\\+2"):
        build_resnet_cifar(CIFAR, 10, depth=21)


def test_width_scales_filters():
    narrow = models.build_model("resnet20", CIFAR, 10, width=8)
    assert narrow.count_params() < models.build_model("resnet20", CIFAR, 10).count_params() / 3


def test_weight_decay_penalises_every_kernel_and_only_when_asked():
    assert not models.build_model("small_cnn", MNIST, 10).losses
    decayed = models.build_model("small_cnn", MNIST, 10, weight_decay=1e-3)
    kernels = [w for w in decayed.trainable_weights if w.path.endswith("kernel")]
    assert len(decayed.losses) == len(kernels) == 3
    expected = sum(1e-3 * float(np.sum(np.square(k.numpy()))) for k in kernels)
    assert float(sum(decayed.losses)) == pytest.approx(expected, rel=1e-5)
    assert len(models.build_model("resnet20", CIFAR, 10).losses) == 20  # paper's 1e-4 default
    with pytest.raises(ValueError, match="weight_decay"):
        models.build_model("mlp", MNIST, 10, weight_decay=-1.0)


def _initial_weights(seed: int) -> list[np.ndarray]:
    keras.utils.set_random_seed(seed)
    return models.build_model("small_cnn", MNIST, 10).get_weights()


def test_seeded_builds_are_identical():
    same, again, other = _initial_weights(7), _initial_weights(7), _initial_weights(8)
    assert all(np.array_equal(a, b) for a, b in zip(same, again))
    assert not np.array_equal(same[0], other[0])


def test_resnet_trains_under_xla():
    """The option-A shortcut layer compiles with XLA (tiny images keep it quick)."""
    model = models.build_model("resnet20", (8, 8, 3), 4)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=True)
    loss = model.train_on_batch(np.ones((4, 8, 8, 3), np.float32), np.arange(4))
    assert np.isfinite(loss)


def test_small_cnn_learns_synthetic_mnist_with_xla():
    keras.utils.set_random_seed(0)
    data = load_dataset("synthetic:mnist", split="train", local_batch_size=32, synthetic_size=640)
    held_out = load_dataset("synthetic:mnist", split="test", local_batch_size=64,
                            synthetic_size=128, shuffle=False, repeat=False)
    model = models.build_model("small_cnn", MNIST, 10)
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
    before = model.evaluate(held_out, verbose=0)
    model.fit(data, steps_per_epoch=20, epochs=1, shuffle=False, verbose=0)
    after = model.evaluate(held_out, verbose=0)
    assert after < 0.5 * before, (before, after)
