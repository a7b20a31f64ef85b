"""Which jobs to pair: maximum-weight matching on the predicted gain of each pair.

The objective is the cluster's total normalised throughput.  A pair scores
``best normalised throughput - 1`` (its gain over time-multiplexing the two
jobs, in solo-job equivalents), so gains add up across pairs and an unpaired
job scores 0.  Pairs below ``min_gain`` are not candidates at all: pairing must
pay clearly, or the jobs stay apart.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Sequence

from crossover_tf_planner import json_io
from crossover_tf_planner.analytical import PairPrediction, predict_pairs
from crossover_tf_planner.device_models import limitation_of
from crossover_tf_planner.profile import JobProfile


@dataclasses.dataclass(frozen=True)
class PairingPlan(json_io.JsonResult):
    """Chosen pairs (with their predictions) and the jobs left to run alone
    (``crossover_tf_planner.pair``'s result: a scheduler reads its ``to_json``)."""

    pairs: list[PairPrediction]
    unpaired: list[str]
    total_gain: float
    candidates: int

    def to_markdown(self) -> str:
        lines = ["| job A | job B | policy | gain vs sequential | gain vs naive |",
                 "|---|---|---|---|---|"]
        lines += [f"| {p.job_a} | {p.job_b} | {p.recommendation} | "
                  f"{p.expected_gain - 1:+.1%} | {p.gain_vs_naive - 1:+.1%} |"
                  for p in self.pairs]
        lines.append(f"\nUnpaired (run alone): {', '.join(self.unpaired) or 'none'}. "
                     f"Total gain: {self.total_gain:.3f} solo-job equivalents.")
        lines += [f"\n{text}" for text in dict.fromkeys(
            limitation_of(p.device_model) for p in self.pairs) if text]
        return "\n".join(lines)


def match_gains(gains: dict[tuple[str, str], float]) -> list[tuple[str, str]]:
    """Maximum-weight matching of jobs on pair gains (only positive gains count)."""
    # Imported here: the runtime (crossover_tf.ProfileCallback) imports the planner's profile
    # records, and a job's environment need not have networkx (the `planner` extra).
    import networkx as nx
    graph = nx.Graph()
    for (a, b), gain in gains.items():
        if a == b:
            raise ValueError(f"pair ({a}, {b}) pairs a job with itself")
        if gain > 0:
            graph.add_edge(a, b, weight=gain)
    matching = nx.max_weight_matching(graph, maxcardinality=False)
    return sorted(tuple(sorted(edge)) for edge in matching)


def plan_pairs(profiles: Sequence[JobProfile], *, min_gain: float = 0.05,
               **predict_kwargs: Any) -> PairingPlan:
    """Predicts every pair of ``profiles`` and picks the pairing with the most gain."""
    if not profiles:
        raise ValueError("cannot plan pairs for an empty job list")
    names = [p.name for p in profiles]
    if len(set(names)) != len(names):
        raise ValueError(f"job names must be unique, got {names}")
    if len(profiles) == 1:
        return PairingPlan(pairs=[], unpaired=names, total_gain=0.0, candidates=0)
    candidates = list(itertools.combinations(profiles, 2))
    predictions = {(a.name, b.name): pred for (a, b), pred in
                   zip(candidates, predict_pairs(candidates, min_gain=min_gain,
                                                 **predict_kwargs))}
    gains = {key: pred.normalised[pred.best_policy] - 1
             for key, pred in predictions.items() if pred.recommendation != "do not pair"}
    chosen = match_gains(gains)
    by_sorted_key = {tuple(sorted(key)): pred for key, pred in predictions.items()}
    pairs = [by_sorted_key[key] for key in chosen]
    paired = {name for key in chosen for name in key}
    return PairingPlan(pairs=pairs, unpaired=[n for n in names if n not in paired],
                       total_gain=sum(gains[(p.job_a, p.job_b)] for p in pairs),
                       candidates=len(gains))
