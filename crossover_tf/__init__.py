"""crossover_tf: two Horovod/Keras jobs time-share accelerators, one computing while the other
communicates (CrossoverScheduler, arXiv 2103.07974).

Heavy modules (TensorFlow, Horovod) load on first attribute access, so tools such as the
planner can import crossover_tf.planner without TensorFlow.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "CrossoverStrategy": "crossover_tf.strategy",
    "DeviceLease": "crossover_tf.ops.lease",
    "LeaseStats": "crossover_tf.ops.lease",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'crossover_tf' has no attribute {name!r}")
