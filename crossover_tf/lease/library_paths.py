"""Where the lease's native libraries and the op library's sources may be (no TensorFlow: the
exporter and the launcher use it too).

Beside the op library in crossover_tf/lease/ (the pip build and ops/Makefile write them there),
or ops/ at the repository root (Bazel's //ops:<name>). An environment variable naming one
library explicitly is each caller's own. The sources are what a first use compiles the op
library from (op_cache.py): a wheel carries them in crossover_tf/lease/op_sources/, a source
tree has them in ops/.
"""
from __future__ import annotations

import pathlib

LEASE_PACKAGE = pathlib.Path(__file__).parent
REPO_OPS = LEASE_PACKAGE.resolve().parents[1] / "ops"
PACKAGED_SOURCES = LEASE_PACKAGE / "op_sources"
OP_LIBRARY = "_lease_ops.so"  # the op library's file name, wherever it is built
# What the op library is made of (ops/Makefile's `op` target): what a wheel carries in
# PACKAGED_SOURCES (setup.py copies them), and what op_cache's build key digests.
OP_SOURCE_GLOBS = ("Makefile", "core/*.cc", "core/*.h", "tf/*.cc", "tf/*.h")


def library_candidates(name: str) -> tuple[pathlib.Path, pathlib.Path]:
    """The places, in order, where the native library `name` (e.g. "_lease_ops.so") may be."""
    return (LEASE_PACKAGE / name, REPO_OPS / name)


def op_sources() -> pathlib.Path | None:
    """The folder holding the op library's Makefile and sources (the wheel's copy first, then
    the source tree's), or None where neither is there (a Bazel build, say)."""
    for folder in (PACKAGED_SOURCES, REPO_OPS):
        if (folder / "Makefile").is_file() and (folder / "tf").is_dir():
            return folder
    return None
