"""Reads TensorBoard event files back, for the tests of what the callbacks log."""
from __future__ import annotations

import collections
import pathlib


def read_scalars(log_dir: pathlib.Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in log_dir's event files: tag -> [(step, value)] in order."""
    import tensorflow as tf
    scalars = collections.defaultdict(list)
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                scalars[value.tag].append((event.step, float(tf.make_ndarray(value.tensor))))
    return dict(scalars)
