"""Finds and loads the device-lease op library (_lease_ops.so, built from ops/ at the root).

Loaded on first use, as Horovod and tensorflow/custom-op do, so a missing build gives a clear
message instead of an ImportError deep in TensorFlow. The pip and Makefile builds write the
TensorFlow version they compiled against beside the library (`_lease_ops.build.json`); a
library built for another TensorFlow is never loaded (its C++ ABI is not stable across
versions). Where no library built for the running TensorFlow sits beside the package (a wheel
from pip's default, isolated build carries none), it is compiled from the op's sources into a
per-version cache on first use (op_cache.py).
"""
from __future__ import annotations

import functools
import json
import os
import pathlib
from typing import Any

import tensorflow as tf
from absl import logging

from crossover_tf.lease import op_cache
from crossover_tf.lease.library_paths import OP_LIBRARY, library_candidates, op_sources

LIBRARY_NAME = OP_LIBRARY
# Where the library may be: $CROSSOVER_LEASE_OPS (explicit), else library_paths' places.
LIBRARY_CANDIDATES = library_candidates(LIBRARY_NAME)
REBUILD_HINT = ("unset CROSSOVER_LEASE_OPS to have crossover_tf compile the library for this "
                "TensorFlow on first use, or rebuild it with `make -C ops PYTHON=$(which python)`"
                " (`pip wheel --no-build-isolation` makes a wheel that carries it)")


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
    """Loads _lease_ops.so once: $CROSSOVER_LEASE_OPS if set (refused, by name, if built for
    another TensorFlow), else a library beside the package built for this TensorFlow, else the
    one op_cache compiles for it from the op's sources."""
    explicit = os.environ.get("CROSSOVER_LEASE_OPS")
    if explicit:
        path = pathlib.Path(explicit)
        if not path.exists():
            raise FileNotFoundError(f"CROSSOVER_LEASE_OPS names {path}, which does not exist")
        check_built_for(path)
        return tf.load_op_library(str(path))
    return tf.load_op_library(str(library_for_this_tensorflow()))


def library_for_this_tensorflow(running: str = tf.__version__) -> pathlib.Path:
    """The first candidate built for `running` (or with no record: Bazel's), else the cache's
    build for it; FileNotFoundError where there is neither a library nor the op's sources."""
    others = []
    for path in LIBRARY_CANDIDATES:
        if path.exists():
            built = built_tensorflow_version(path)
            if built in (None, running):
                return path
            others.append(f"{path} (TensorFlow {built})")
    sources = op_sources()
    if sources is None:
        raise FileNotFoundError(
            f"crossover_tf lease op library for TensorFlow {running} not found (looked in "
            f"{[str(c) for c in LIBRARY_CANDIDATES]}; found {others or 'none'}) and its sources "
            "are not installed to compile it from: reinstall crossover_tf (`pip install "
            "<wheel or source tree>`), or build it with `make -C ops PYTHON=$(which python)`")
    if others:
        logging.info("crossover_tf: %s built for another TensorFlow; using the cache's build "
                     "for TensorFlow %s", ", ".join(others), running)
    return op_cache.cached_library(running, sources)
