"""The names of the ways two jobs can share devices, in one place.

The analytical model, the simulator, the cluster simulation and the experiments all speak of
these policies; a recommendation ("cross", "shift", "naive", "do not pair") names the policy
to run.
"""

from __future__ import annotations

POLICIES = ("sequential", "naive", "shift", "crossover")
PREDICTED = POLICIES + ("crossover_turn",)  # crossover with link turns
MEASURED = ("sequential", "naive", "crossover")  # what experiments/compare.py runs by default
VALIDATED = MEASURED + ("crossover_turn", "shift")  # measured scenarios the planner predicts
RECOMMENDED_POLICY = {"cross": "crossover", "shift": "shift", "naive": "naive",
                      "do not pair": "sequential"}


def recommended_policy(recommendation: str) -> str:
    """The policy a recommendation runs ("cross" -> "crossover", "do not pair" -> sequential)."""
    return RECOMMENDED_POLICY[recommendation]
