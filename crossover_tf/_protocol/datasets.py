"""This rank's part of a dataset of global batches, and whether a dataset is one rank's already.

Why the mark: MultiWorkerMirroredStrategy's fit splits a dataset of global batches across the
workers by itself (its DATA auto-shard), so a ported fit script passes the global dataset. fit
on a model made in scope() does the same here (_keras/fit_guard), unless the dataset is one
rank's already: made by the strategy's distribute methods (or derived from one: the mark is
looked up through the dataset's inputs), or with auto-sharding turned off in its options, as
MultiWorkerMirroredStrategy honours.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

_MARK = "_crossover_rank_dataset"
_MAX_LINEAGE = 10_000  # datasets looked at when searching a pipeline's inputs


def mark_per_rank(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Marks dataset as one rank's part (the strategy's distribute methods return it)."""
    setattr(dataset, _MARK, True)
    return dataset


def is_per_rank(dataset: tf.data.Dataset) -> bool:
    """Whether dataset, or a dataset it was made from, is one rank's part, or its options turn
    auto-sharding off."""
    policy = dataset.options().experimental_distribute.auto_shard_policy
    if policy == tf.data.experimental.AutoShardPolicy.OFF:
        return True
    seen, todo = 0, [dataset]
    while todo and seen < _MAX_LINEAGE:
        node = todo.pop()
        seen += 1
        if getattr(node, _MARK, False):
            return True
        todo.extend(getattr(node, "_inputs", lambda: [])())
    return False


def split_global_batches(dataset: tf.data.Dataset, rank: int, size: int,
                         contiguous: bool) -> tf.data.Dataset:
    """This rank's rows of each global batch (of a size divisible by `size`): strided (rank,
    rank+N, ...) or contiguous ([rank * B/N, (rank + 1) * B/N), MultiWorkerMirroredStrategy's
    DATA split). Marked as one rank's part."""
    if size == 1:
        return mark_per_rank(dataset)

    def rows(t: Any) -> Any:
        if not contiguous:
            return t[rank::size]
        per = tf.shape(t)[0] // size
        return t[rank * per:(rank + 1) * per]

    def take_rows(*batch: Any) -> Any:
        first = tf.nest.flatten(batch)[0]
        tf.debugging.assert_equal(
            tf.shape(first)[0] % size, 0,
            message=f"global batch size must be divisible by the {size} ranks")
        picked = tf.nest.map_structure(rows, batch)
        return picked if len(picked) > 1 else picked[0]

    return mark_per_rank(dataset.map(take_rows, num_parallel_calls=tf.data.AUTOTUNE,
                                     deterministic=True).prefetch(tf.data.AUTOTUNE))
