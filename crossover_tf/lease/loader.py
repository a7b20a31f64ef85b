"""Finds and loads the device-lease op library (_lease_ops.so, built from ops/ at the root).

Loaded on first use, as Horovod and tensorflow/custom-op do, so a missing build gives a clear
message instead of an ImportError deep in TensorFlow.
"""
from __future__ import annotations

import functools
import os
import pathlib
from typing import Any

import tensorflow as tf

LIBRARY_NAME = "_lease_ops.so"
# Where the library may be: $CROSSOVER_LEASE_OPS (explicit), beside this file (pip build,
# ops/Makefile), or ops/ at the repository root (Bazel runfiles of //ops:_lease_ops.so).
LIBRARY_CANDIDATES = (pathlib.Path(__file__).with_name(LIBRARY_NAME),
                      pathlib.Path(__file__).resolve().parents[2] / "ops" / LIBRARY_NAME)


@functools.lru_cache(maxsize=None)
def load_library() -> Any:
    """Loads _lease_ops.so once; raises a clear error if it was never built."""
    explicit = os.environ.get("CROSSOVER_LEASE_OPS")
    candidates = (pathlib.Path(explicit),) if explicit else LIBRARY_CANDIDATES
    for path in candidates:
        if path.exists():
            return tf.load_op_library(str(path))
    raise FileNotFoundError(
        f"crossover_tf lease op library not found (looked in {[str(c) for c in candidates]}); "
        "build it with `make -C ops PYTHON=$(which python)` or run scripts/install.sh")
