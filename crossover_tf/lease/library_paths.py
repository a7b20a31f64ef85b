"""Where the lease's native libraries may be (no TensorFlow: the exporter and the launcher
use it too).

Beside the op library in crossover_tf/lease/ (the pip build and ops/Makefile write them there),
or ops/ at the repository root (Bazel's //ops:<name>). An environment variable naming one
library explicitly is each caller's own.
"""
from __future__ import annotations

import pathlib

LEASE_PACKAGE = pathlib.Path(__file__).parent


def library_candidates(name: str) -> tuple[pathlib.Path, pathlib.Path]:
    """The places, in order, where the native library `name` (e.g. "_lease_ops.so") may be."""
    return (LEASE_PACKAGE / name, LEASE_PACKAGE.resolve().parents[1] / "ops" / name)
