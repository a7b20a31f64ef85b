"""How often two jobs sharing a device really crossed: what the end-to-end tests of crossing
assert on. The runtime never needs it, so it lives with the tests."""
from __future__ import annotations

import numpy as np

from crossover_tf.profiling import phases as timeline


def overlap_steps(mine: np.ndarray, peer: np.ndarray) -> int:
    """How many of my compute phases overlap one of the peer's communication phases: the
    crossover effect itself (both arguments are crossover_tf.profiling.phases.step_phases
    arrays of the same host)."""
    count = 0
    for start, end in mine[:, 0:2]:
        overlap = np.minimum(end, peer[:, 2]) - np.maximum(start, peer[:, 1])
        count += bool(np.any(overlap > 0))
    return count


def turn_intervals(result: dict) -> np.ndarray:
    """[turns, 2] start_ns, done_ns of one rank's link turns (its allreduces), from a worker's
    result: its "turn_timeline" (strategy.link_turn_timeline())."""
    return np.asarray(result["turn_timeline"], dtype=np.int64).reshape(-1, 4)[:, 1:3]


def check_turns_inside_steps(result: dict, steps: int) -> None:
    """One rank took one link turn a step, none skipped, each begun after its step's yield and
    done before its apply began (its "timeline" is the lease's)."""
    stats = result["link_turn_stats"]
    assert stats["turns"] == steps and stats["skipped"] == 0, stats
    phases = timeline.step_phases(result["timeline"])
    turns = turn_intervals(result)
    assert np.all(phases[:, 1] <= turns[:, 0]), "allreduce began before the yield"
    assert np.all(turns[:, 1] <= phases[:, 3]), "apply began before the allreduce ended"


def overlapping_turns(a: dict, b: dict) -> int:
    """How many of two jobs' link turns on one host began before the one before them ended."""
    both = sorted([*map(tuple, turn_intervals(a)), *map(tuple, turn_intervals(b))])
    return sum(end > start for (_, end), (start, _) in zip(both, both[1:]))
