"""Which datasets fit splits across the ranks itself, and how (crossover_tf/_protocol/datasets)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from crossover_tf._protocol import datasets


def _global() -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(np.arange(16)).batch(8)


def test_a_rank_dataset_is_known_through_what_is_made_from_it():
    assert not datasets.is_per_rank(_global())
    mine = datasets.split_global_batches(_global(), rank=1, size=2, contiguous=True)
    assert datasets.is_per_rank(mine)
    assert datasets.is_per_rank(mine.map(lambda x: x + 1).prefetch(2).take(1))
    assert datasets.is_per_rank(datasets.mark_per_rank(_global()).repeat())
    off = tf.data.Options()
    off.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    assert datasets.is_per_rank(_global().with_options(off))  # as MirroredStrategy honours


def test_each_rank_takes_its_slice_of_every_global_batch():
    contiguous = [list(b.numpy()) for b in datasets.split_global_batches(
        _global(), rank=1, size=2, contiguous=True)]
    strided = [list(b.numpy()) for b in datasets.split_global_batches(
        _global(), rank=1, size=2, contiguous=False)]
    assert contiguous == [[4, 5, 6, 7], [12, 13, 14, 15]]
    assert strided == [[1, 3, 5, 7], [9, 11, 13, 15]]
