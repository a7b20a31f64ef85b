"""Input pipelines: specs, argument errors, synthetic determinism, per-rank sharding semantics."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

from experiments.datasets import (  # noqa: E402
    DATASETS, dataset_spec, load_dataset)

TINY = dict(split="train", image_shape=(4, 4, 1), num_classes=3)


def _batches(name: str = "synthetic", steps: int = 3, **kwargs) -> list[tuple[np.ndarray, ...]]:
    dataset = load_dataset(name, **{**TINY, **kwargs})
    return [(x.numpy(), y.numpy()) for x, y in dataset.take(steps)]


def _rows(images: np.ndarray) -> set[bytes]:
    return {row.tobytes() for row in images}


def test_spec_table_matches_the_real_datasets():
    shapes = {name: (spec.image_shape, spec.num_classes) for name, spec in DATASETS.items()}
    assert shapes == {"mnist": ((28, 28, 1), 10), "cifar10": ((32, 32, 3), 10),
                      "imagenet2012": ((224, 224, 3), 1000)}
    assert DATASETS["imagenet2012"].splits == ("train", "validation")


def test_synthetic_imitates_a_real_dataset_or_takes_explicit_shape():
    spec = dataset_spec("synthetic:cifar10")
    assert (spec.image_shape, spec.num_classes, spec.is_synthetic) == ((32, 32, 3), 10, True)
    assert dataset_spec("synthetic", image_shape=[5, 6, 2], num_classes=4).image_shape == (5, 6, 2)
    assert dataset_spec("synthetic:imagenet2012", num_classes=10).num_classes == 10
    assert not dataset_spec("mnist").is_synthetic


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="imagenet"), r"unknown dataset 'imagenet'.*synthetic:mnist.*imagenet2012"),
    (dict(name="synthetic:svhn"), r"unknown dataset 'synthetic:svhn'"),
    (dict(name="synthetic", image_shape=None), "needs image_shape and num_classes"),
    (dict(image_shape=(4, 4)), r"image_shape must be \(height, width, channels\)"),
    (dict(num_classes=1), "num_classes must be >= 2"),
    (dict(name="mnist", num_classes=3, image_shape=None), "has 10 classes, not 3"),
    (dict(local_batch_size=0), "local_batch_size must be a positive integer, got 0"),
    (dict(num_shards=0), "num_shards must be a positive integer"),
    (dict(num_shards=2, shard_index=2), r"shard_index must be in \[0, 2\), got 2"),
    (dict(shard_index=-1), r"shard_index must be in \[0, 1\), got -1"),
    (dict(split="validation"), "no split 'validation'; choose one of: train, test"),
    (dict(synthetic_size=8, num_shards=4, local_batch_size=4), "2 per shard"),
    (dict(name="cifar10", image_shape=None, num_classes=None), "pass data_dir"),
])
def test_bad_arguments_name_the_value_and_the_choices(kwargs, message):
    args = {"name": "synthetic", **TINY, "local_batch_size": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        load_dataset(args.pop("name"), **args)


@pytest.mark.parametrize("name, advice", [
    ("mnist", r"tfds build mnist --data_dir=<dir>"),
    ("imagenet2012", r"ILSVRC2012_img_train\.tar .* in \S+/downloads/manual.*--manual_dir"),
])
def test_unprepared_dataset_says_where_to_put_it(tmp_path, name, advice):
    version_dir = tmp_path / name / str(tfds.builder(name, data_dir=str(tmp_path)).version)
    with pytest.raises(FileNotFoundError, match=advice) as error:
        load_dataset(name, split="train", local_batch_size=2, data_dir=str(tmp_path))
    assert str(version_dir) in str(error.value) and "never download" in str(error.value)
    assert list(tmp_path.iterdir()) == []  # nothing was downloaded or created


def test_batches_have_the_promised_shapes_and_types():
    images, labels = _batches("synthetic:cifar10", split="train", image_shape=None,
                              num_classes=None, local_batch_size=5, synthetic_size=20)[0]
    assert images.shape == (5, 32, 32, 3) and images.dtype == np.float32
    assert labels.dtype == np.int32 and set(labels) <= set(range(10))
    assert abs(images.mean()) < 0.5 and 0.5 < images.std() < 2.0  # roughly normalised


def test_synthetic_data_is_deterministic_per_seed():
    first, again = _batches(seed=3, local_batch_size=4), _batches(seed=3, local_batch_size=4)
    other = _batches(seed=4, local_batch_size=4)
    for (x1, y1), (x2, y2) in zip(first, again):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(first, other))
    # The seed orders the same examples; it does not change them.
    unshuffled = _batches(shuffle=False, local_batch_size=4, synthetic_size=8, steps=2)
    reshuffled = _batches(seed=4, local_batch_size=4, synthetic_size=8, steps=2)
    assert _rows(np.concatenate([x for x, _ in unshuffled])) == _rows(
        np.concatenate([x for x, _ in reshuffled]))


def test_splits_hold_different_examples_of_learnable_classes():
    """Class means of the train split classify the test split: the data is learnable."""
    shape = dict(image_shape=(8, 8, 1), shuffle=False, local_batch_size=60, steps=1)
    train_x, train_y = _batches(**shape)[0]
    test_x, test_y = _batches(split="test", **shape)[0]
    np.testing.assert_array_equal(train_y, test_y)
    assert not _rows(train_x) & _rows(test_x)
    means = np.stack([train_x[train_y == c].mean(axis=0).ravel() for c in range(3)])
    distances = np.linalg.norm(test_x.reshape(60, 1, -1) - means[np.newaxis], axis=-1)
    assert np.mean(distances.argmin(axis=1) == test_y) > 0.9


@pytest.mark.parametrize("num_shards", [2, 4])
def test_shards_union_to_the_single_process_global_batch(num_shards):
    """Step s on n ranks sees exactly the rows of step s of one process with batch n*local."""
    local, steps = 3, 10  # 48 examples / 12 or 6 per step: several epochs, reshuffled each time
    common = dict(seed=5, synthetic_size=48, steps=steps)
    global_batches = _batches(local_batch_size=num_shards * local, **common)
    per_rank = [_batches(local_batch_size=local, num_shards=num_shards, shard_index=rank, **common)
                for rank in range(num_shards)]
    for step, (global_images, global_labels) in enumerate(global_batches):
        rank_images = [per_rank[rank][step][0] for rank in range(num_shards)]
        assert set().union(*map(_rows, rank_images)) == _rows(global_images)
        assert sum(len(_rows(x)) for x in rank_images) == len(global_images)  # disjoint
        for rank in range(num_shards):
            np.testing.assert_array_equal(global_images[rank::num_shards], rank_images[rank])
            np.testing.assert_array_equal(global_labels[rank::num_shards],
                                          per_rank[rank][step][1])


def test_uneven_epochs_are_trimmed_so_ranks_stay_in_lockstep():
    counts = [len(_batches(local_batch_size=1, num_shards=4, shard_index=rank, repeat=False,
                           synthetic_size=50, steps=-1)) for rank in range(4)]
    assert counts == [12] * 4


class _FakeMnist(tfds.testing.DummyMnist, skip_registration=True):
    """20 all-ones 28x28 images labelled i % 10, generated offline."""

    url_infos = None  # skip the checksum lookup (needs importlib_resources)


@pytest.fixture(scope="module")
def prepared_mnist_dir(tmp_path_factory) -> str:
    data_dir = str(tmp_path_factory.mktemp("tfds"))
    _FakeMnist(data_dir=data_dir).download_and_prepare()
    return data_dir


def test_prepared_tfds_data_is_decoded_normalised_and_sharded(prepared_mnist_dir, monkeypatch):
    monkeypatch.setattr(tfds, "builder", lambda name, data_dir: _FakeMnist(data_dir=data_dir))
    read = dict(split="test", data_dir=prepared_mnist_dir, shuffle=False, repeat=False)
    whole = [y.numpy() for _, y in load_dataset("mnist", local_batch_size=10, **read)]
    assert sorted(np.concatenate(whole)) == sorted(list(range(10)) * 2)
    for rank in range(2):
        batches = list(load_dataset("mnist", local_batch_size=5, num_shards=2, shard_index=rank,
                                    **read))
        assert len(batches) == 2
        for step, (images, labels) in enumerate(batches):
            assert images.shape == (5, 28, 28, 1) and labels.dtype == np.int32
            np.testing.assert_allclose(images.numpy(), (1 / 255 - 0.1307) / 0.3081, rtol=1e-5)
            np.testing.assert_array_equal(labels, whole[step][rank::2])
