"""Finds and loads the device-lease op library (_lease_ops.so, built from ops/ at the root).

Loaded on first use, as Horovod and tensorflow/custom-op do, so a missing build gives a clear
message instead of an ImportError deep in TensorFlow. The pip and Makefile builds write the
TensorFlow version they compiled against beside the library (`_lease_ops.build.json`); a
library built for another TensorFlow is refused by name rather than failing on its C++ ABI.
"""
from __future__ import annotations

import functools
import json
import os
import pathlib
from typing import Any

import tensorflow as tf

from crossover_tf.lease.library_paths import library_candidates

LIBRARY_NAME = "_lease_ops.so"
# Where the library may be: $CROSSOVER_LEASE_OPS (explicit), else library_paths' places.
LIBRARY_CANDIDATES = library_candidates(LIBRARY_NAME)
REBUILD_HINT = ("reinstall crossover_tf against this TensorFlow "
                "(`pip install --no-build-isolation --force-reinstall --no-deps .` in its "
                "source tree, or scripts/install.sh), or rebuild it with "
                "`make -C ops PYTHON=$(which python)`")


class TensorFlowVersionMismatch(RuntimeError):
    """The op library was compiled against another TensorFlow than the one running."""


def build_record_path(library: pathlib.Path) -> pathlib.Path:
    """Where a build writes what it compiled against: `<name>.build.json` beside `<name>.so`."""
    return library.with_suffix(".build.json")


def built_tensorflow_version(library: pathlib.Path) -> str | None:
    """The TensorFlow version library was built against, or None where no build recorded it
    (Bazel and hand-made builds write no record; those are the builder's responsibility)."""
    record = build_record_path(library)
    if not record.exists():
        return None
    try:
        return str(json.loads(record.read_text())["tensorflow"])
    except (ValueError, KeyError, TypeError) as err:
        raise TensorFlowVersionMismatch(
            f"unreadable build record {record} ({err!r}); {REBUILD_HINT}") from err


def check_built_for(library: pathlib.Path, running: str = tf.__version__) -> None:
    """Raises TensorFlowVersionMismatch, naming both versions, if library's build record
    names another TensorFlow than `running`."""
    built = built_tensorflow_version(library)
    if built is not None and built != running:
        raise TensorFlowVersionMismatch(
            f"crossover_tf lease op library {library} was built against TensorFlow {built}, "
            f"but this process runs TensorFlow {running}; {REBUILD_HINT}")


@functools.lru_cache(maxsize=None)
def load_library() -> Any:
    """Loads _lease_ops.so once; raises a clear error if it was never built or was built
    against another TensorFlow."""
    explicit = os.environ.get("CROSSOVER_LEASE_OPS")
    candidates = (pathlib.Path(explicit),) if explicit else LIBRARY_CANDIDATES
    for path in candidates:
        if path.exists():
            check_built_for(path)
            return tf.load_op_library(str(path))
    raise FileNotFoundError(
        f"crossover_tf lease op library not found (looked in {[str(c) for c in candidates]}); "
        "install crossover_tf with `pip install --no-build-isolation .` (it builds the op "
        "against the installed TensorFlow), or build it with `make -C ops "
        "PYTHON=$(which python)`, or run scripts/install.sh")
