"""Input pipelines: prepared TFDS datasets read from a data_dir, or synthetic data made in-process.

Nothing here downloads. Every pipeline is ordered

    shuffle(seed) -> take(multiple of num_shards) -> shard -> repeat -> map -> batch -> prefetch

so the shuffle is identical on every rank and rank i's step-s local batch holds the elements at
global positions s*G + i + n*k (n shards, G = n * local_batch_size): the union of the ranks'
step-s batches is the single-process step-s global batch. Trimming each epoch to a multiple of
num_shards keeps the ranks in lockstep across epoch boundaries. The shuffle order also depends on
TensorFlow's global seed, so every rank must set the same one (keras.utils.set_random_seed).

tf.data's autotuning is off (fixed_pipeline_options): its model thread outlived every fit by up
to its optimisation period, and its passes ran on the core the job measures on.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import zlib
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

SYNTHETIC = "synthetic"
_SYNTHETIC_TABLE_MAX_BYTES = 256 << 20

# Synthetic images are a smooth per-class template (low-res noise upsampled) plus pixel noise.
_TEMPLATE_RESOLUTION = 8
_TEMPLATE_KEY = 0x5EED
_NOISE_STD = 1.0


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """What a model needs to know about a dataset, and where TFDS keeps it."""

    name: str
    image_shape: tuple[int, int, int]
    num_classes: int
    splits: tuple[str, ...]
    tfds_name: str | None = None  # None: synthetic, generated in-process
    mean: tuple[float, ...] = (0.0,)  # per-channel pixel mean, pixels scaled to [0, 1]
    std: tuple[float, ...] = (1.0,)
    shuffle_buffer: int = 10_000
    manual_download: bool = False  # TFDS needs the archives placed in its manual_dir

    @property
    def is_synthetic(self) -> bool:
        return self.tfds_name is None


DATASETS: dict[str, DatasetSpec] = {
    "mnist": DatasetSpec(
        "mnist", (28, 28, 1), 10, ("train", "test"), tfds_name="mnist",
        mean=(0.1307,), std=(0.3081,), shuffle_buffer=60_000),
    "cifar10": DatasetSpec(
        "cifar10", (32, 32, 3), 10, ("train", "test"), tfds_name="cifar10",
        mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616), shuffle_buffer=50_000),
    "imagenet2012": DatasetSpec(
        "imagenet2012", (224, 224, 3), 1000, ("train", "validation"), tfds_name="imagenet2012",
        mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), shuffle_buffer=10_000,
        manual_download=True),
}


def available_datasets() -> list[str]:
    """Every name `load_dataset` accepts."""
    return [SYNTHETIC, *(f"{SYNTHETIC}:{real}" for real in DATASETS), *DATASETS]


def dataset_spec(
    name: str,
    *,
    image_shape: Sequence[int] | None = None,
    num_classes: int | None = None,
) -> DatasetSpec:
    """Resolves `name` (a real dataset, `synthetic:<real>` or `synthetic`) to its spec.

    `image_shape` resizes images (any dataset); `num_classes` may only differ from the real
    dataset's for synthetic data. Plain `synthetic` needs both.
    """
    base_name, is_synthetic = _parse_name(name)
    if base_name is None:
        if image_shape is None or num_classes is None:
            raise ValueError(f"dataset {name!r} needs image_shape and num_classes "
                             f"(or name one to imitate: {SYNTHETIC}:{'|'.join(DATASETS)})")
        spec = DatasetSpec(SYNTHETIC, _image_shape(image_shape), num_classes, ("train", "test"))
    else:
        spec = DATASETS[base_name]
        if is_synthetic:
            spec = dataclasses.replace(spec, name=name, tfds_name=None, manual_download=False)
        if num_classes is not None and num_classes != spec.num_classes and not is_synthetic:
            raise ValueError(f"dataset {name!r} has {spec.num_classes} classes, not {num_classes}")
    if image_shape is not None:
        spec = dataclasses.replace(spec, image_shape=_image_shape(image_shape))
    if num_classes is not None:
        spec = dataclasses.replace(spec, num_classes=num_classes)
    if spec.num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {spec.num_classes}")
    return spec


def load_dataset(
    name: str,
    *,
    split: str,
    local_batch_size: int,
    num_shards: int = 1,
    shard_index: int = 0,
    seed: int = 0,
    data_dir: str | None = None,
    shuffle: bool = True,
    repeat: bool = True,
    synthetic_size: int = 4096,
    image_shape: Sequence[int] | None = None,
    num_classes: int | None = None,
) -> tf.data.Dataset:
    """This rank's batches of (float32 normalised images, int32 labels), drop_remainder=True.

    `num_shards`/`shard_index` are the Horovod size/rank; `seed` fixes the shuffle, which must
    be the same on every rank. Real datasets must already be prepared under `data_dir`.
    """
    spec = dataset_spec(name, image_shape=image_shape, num_classes=num_classes)
    _require_positive(local_batch_size=local_batch_size, num_shards=num_shards,
                      synthetic_size=synthetic_size)
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index must be in [0, {num_shards}), got {shard_index}")
    if split not in spec.splits:
        raise ValueError(f"dataset {name!r} has no split {split!r}; choose one of: "
                         f"{', '.join(spec.splits)}")
    if spec.is_synthetic:
        examples, size = tf.data.Dataset.range(synthetic_size), synthetic_size
        to_example = _synthetic_lookup(spec, _split_key(split), synthetic_size)
    else:
        examples, size = _prepared_tfds_split(spec, split, data_dir)
        to_example = functools.partial(_decode_example, spec)
    if size // num_shards < local_batch_size:
        raise ValueError(f"{name!r}/{split} has {size} examples: {size // num_shards} per shard, "
                         f"fewer than local_batch_size={local_batch_size}")
    return _sharded_batches(
        examples, size, to_example, shuffle_buffer=spec.shuffle_buffer if shuffle else 0,
        seed=seed, num_shards=num_shards, shard_index=shard_index, repeat=repeat,
        local_batch_size=local_batch_size)


def _sharded_batches(
    examples: tf.data.Dataset,
    size: int,
    to_example: Callable,
    *,
    shuffle_buffer: int,
    seed: int,
    num_shards: int,
    shard_index: int,
    repeat: bool,
    local_batch_size: int,
) -> tf.data.Dataset:
    """The pipeline whose order gives the sharding guarantee in the module docstring."""
    if shuffle_buffer:
        examples = examples.shuffle(min(size, shuffle_buffer), seed=seed,
                                    reshuffle_each_iteration=True)
    examples = examples.take(size - size % num_shards).shard(num_shards, shard_index)
    if repeat:
        examples = examples.repeat()
    examples = examples.map(to_example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    batches = examples.batch(local_batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    return batches.with_options(fixed_pipeline_options())


def fixed_pipeline_options() -> tf.data.Options:
    """tf.data options without the autotuning model thread (AUTOTUNE's parallelism and buffer
    then keep their defaults: the cores this process may use, and a prefetch buffer that
    grows while the step waits).

    Why: in TensorFlow 2.21 the iterator's destructor waits for that thread, which sleeps out
    its optimisation period, growing to a minute, before it sees the cancellation: in the main
    job, 0 to 51 s passed between a run's last step and fit's return (gdb: the main thread in
    ~RootDataset::Iterator waiting on Model::OptimizeLoop). Its optimisation passes also ran
    on the one core each emulated host has, the core whose compute time C the comparison
    measures."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def _parse_name(name: str) -> tuple[str | None, bool]:
    """(real dataset imitated or read, whether synthetic); ValueError for unknown names."""
    if name == SYNTHETIC:
        return None, True
    if isinstance(name, str):
        prefix, _, base = name.partition(":")
        if prefix == SYNTHETIC and base in DATASETS:
            return base, True
        if name in DATASETS:
            return name, False
    raise ValueError(f"unknown dataset {name!r}; choose one of: {', '.join(available_datasets())}")


def _image_shape(shape: Sequence[int]) -> tuple[int, int, int]:
    shape = tuple(int(dim) for dim in shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"image_shape must be (height, width, channels) > 0, got {shape}")
    return shape


def _require_positive(**values: int) -> None:
    for key, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")


def _split_key(split: str) -> int:
    """A per-split RNG key that is the same in every process (unlike hash())."""
    return zlib.crc32(split.encode()) & 0x7FFFFFFF


def _synthetic_example(spec: DatasetSpec, split_key: int, index: tf.Tensor):
    """Example `index`: its class's template plus noise, keyed by (split, index) only."""
    label = tf.cast(index % spec.num_classes, tf.int32)
    height, width, channels = spec.image_shape
    coarse = (min(height, _TEMPLATE_RESOLUTION), min(width, _TEMPLATE_RESOLUTION), channels)
    template_seed = tf.stack([tf.constant(_TEMPLATE_KEY, tf.int64), tf.cast(label, tf.int64)])
    template = tf.image.resize(
        tf.random.stateless_normal(coarse, seed=template_seed)[tf.newaxis], (height, width))[0]
    noise_seed = tf.stack([tf.constant(split_key, tf.int64), index])
    noise = tf.random.stateless_normal(spec.image_shape, seed=noise_seed)
    return template + _NOISE_STD * noise, label


def _synthetic_lookup(spec: DatasetSpec, split_key: int, size: int):
    """index -> example. Small synthetic sets are generated once into a table so that feeding a
    step costs a gather, not image synthesis: on a CPU "device" the input pipeline would
    otherwise compete with training for the same core and distort step timings. Large ones
    (imagenet-shaped) are generated per element, as before; values are identical either way."""
    generate = functools.partial(_synthetic_example, spec, split_key)
    table_bytes = size * int(np.prod(spec.image_shape)) * 4
    if table_bytes > _SYNTHETIC_TABLE_MAX_BYTES:
        return generate
    images, labels = (tf.data.Dataset.range(size).map(generate, deterministic=True)
                      .batch(size).get_single_element())
    return lambda index: (tf.gather(images, index), tf.gather(labels, index))


def _decode_example(spec: DatasetSpec, example: dict[str, tf.Tensor]):
    """Decodes after sharding, so each rank only decodes its own images."""
    image = tf.io.decode_image(example["image"], channels=spec.image_shape[-1],
                               expand_animations=False)
    image = tf.image.resize(image, spec.image_shape[:2]) / 255.0
    image = (image - tf.constant(spec.mean)) / tf.constant(spec.std)
    label = tf.cast(example["label"], tf.int32)
    return tf.ensure_shape(image, spec.image_shape), label


def _prepared_tfds_split(spec: DatasetSpec, split: str,
                         data_dir: str | None) -> tuple[tf.data.Dataset, int]:
    """Examples {"image": encoded bytes, "label": ...} in file order and their count.

    Checks the prepared files exist instead of calling download_and_prepare.
    """
    if not data_dir:
        raise ValueError(f"dataset {spec.name!r} is read from prepared TFDS files: pass data_dir "
                         f"(--data_dir), or use '{SYNTHETIC}:{spec.name}' for synthetic data")
    builder = tfds.builder(spec.tfds_name, data_dir=data_dir)
    if not builder.is_prepared():
        raise FileNotFoundError(_missing_data_message(spec, builder.data_dir, data_dir))
    examples = builder.as_dataset(
        split=split, shuffle_files=False,
        decoders={"image": tfds.decode.SkipDecoding()})
    return examples, builder.info.splits[split].num_examples


def _missing_data_message(spec: DatasetSpec, version_dir: str, data_dir: str) -> str:
    """Where the prepared files belong and how to make them without downloading here."""
    where = (f"dataset {spec.name!r} is not prepared in data_dir={data_dir!r}: expected the "
             f"prepared TFDS files (dataset_info.json, *.tfrecord*) in {version_dir}. "
             f"Runs never download. ")
    if spec.manual_download:
        manual_dir = os.path.join(data_dir, "downloads", "manual")
        return where + (
            f"Put ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar in {manual_dir}, then "
            f"run `tfds build {spec.tfds_name} --data_dir={data_dir} --manual_dir={manual_dir}`.")
    return where + (
        f"Run `tfds build {spec.tfds_name} --data_dir=<dir>` on a machine with internet access "
        f"and copy <dir>/{spec.tfds_name} to {os.path.join(data_dir, spec.tfds_name)}.")
