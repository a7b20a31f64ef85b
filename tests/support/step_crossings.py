"""How often two jobs sharing a device really crossed: what the end-to-end tests of crossing
assert on. The runtime never needs it, so it lives with the tests."""
from __future__ import annotations

import numpy as np


def overlap_steps(mine: np.ndarray, peer: np.ndarray) -> int:
    """How many of my compute phases overlap one of the peer's communication phases: the
    crossover effect itself (both arguments are crossover_tf.profiling.phases.step_phases
    arrays of the same host)."""
    count = 0
    for start, end in mine[:, 0:2]:
        overlap = np.minimum(end, peer[:, 2]) - np.maximum(start, peer[:, 1])
        count += bool(np.any(overlap > 0))
    return count
