"""Repeated trials of a comparison: interleaved order, and median with min/max per ratio.

One run of each scenario says little on a shared machine: a slow minute lands on whichever
scenario ran then. Running every scenario once per trial, in an order rotated each trial, lets
drift hit all scenarios; the spread across trials says how far a ratio can be trusted.
"""
from __future__ import annotations

import collections
import statistics
from typing import Any, Mapping, Sequence

from crossover_tf_planner.validate import measured_winner
from crossover_tf_planner.job_stats import JobStats

# The ratio that picks the representative trial (the one whose scenarios compare.json shows).
PRIMARY_RATIO = "crossover_over_naive"
# Each crossed scenario's measured/ideal ratio: its <scenario>_over_sequential over the ideal.
OVER_IDEAL = {"crossover": "measured_over_ideal",
              "crossover_turn": "crossover_turn_measured_over_ideal"}


def trial_order(scenarios: Sequence[str], trial: int) -> list[str]:
    """Scenario order of one trial: the list rotated left by `trial`."""
    shift = trial % len(scenarios)
    return [*scenarios[shift:], *scenarios[:shift]]


def spread(values: Sequence[float], trials: int | None = None) -> dict[str, Any]:
    """Median, min, max and the per-trial values; `trials` (when more trials ran than gave a
    value, e.g. a scenario invalid in some) is kept as "of_trials" so the count stays shown."""
    record = {"median": statistics.median(values), "min": min(values), "max": max(values),
              "values": list(values)}
    if trials is not None and trials != len(values):
        record["of_trials"] = trials
    return record


def comm_to_compute(result: Mapping[str, Any]) -> float:
    """M/C of one trial from its solo profiles: total allreduce over total device time."""
    solos = [JobStats.from_dict(job) for name, scenario in result["scenarios"].items()
             if name.startswith("solo_") for job in scenario["jobs"].values()]
    return sum(s.comm_s for s in solos) / sum(s.device_s for s in solos)


def representative_trial(per_trial: Sequence[Mapping[str, Any]]) -> int:
    """Index of the trial whose primary ratio is the (lower) median; trial 0 when the
    comparison has no such ratio (e.g. without the naive scenario)."""
    having = [i for i, t in enumerate(per_trial) if PRIMARY_RATIO in t["ratios"]]
    if not having:
        return 0
    ranked = sorted(having, key=lambda i: per_trial[i]["ratios"][PRIMARY_RATIO])
    return ranked[(len(ranked) - 1) // 2]


def combine(per_trial: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """compare.json's body from per-trial summaries: the representative trial's scenarios,
    "ratios" as medians over the trials that measured them with "ratio_spread" beside them,
    "invalid" (per scenario, the trials it was refused in and why), "checks" (what failed
    a sanity check, e.g. a measured ratio above its ideal), and every trial."""
    if not per_trial:
        raise ValueError("no trials to combine")
    chosen = representative_trial(per_trial)
    names = list(dict.fromkeys(name for t in per_trial for name in t["ratios"]))
    ratio_spread = {name: spread([t["ratios"][name] for t in per_trial if name in t["ratios"]],
                                 trials=len(per_trial)) for name in names}
    invalid: dict[str, list[dict[str, Any]]] = {}
    for trial, t in enumerate(per_trial):
        for name, reason in t.get("invalid", {}).items():
            invalid.setdefault(name, []).append({"trial": trial, "reason": reason})
    return {"trials": len(per_trial), "representative_trial": chosen,
            "scenarios": per_trial[chosen]["scenarios"],
            "ratios": {name: s["median"] for name, s in ratio_spread.items()},
            "ratio_spread": ratio_spread, "invalid": invalid,
            "checks": above_ideal(ratio_spread),
            "achieved_comm_to_compute": spread([comm_to_compute(t) for t in per_trial]),
            "per_trial": list(per_trial)}


def above_ideal(ratio_spread: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A crossed scenario whose measured/ideal exceeds 1 in every trial that measured it:
    beyond its own spread, so the measurement or the bound is wrong (the ideal assumes each
    job's compute hides entirely under the others' allreduces, which nothing can beat)."""
    flagged = []
    for crossed, key in OVER_IDEAL.items():
        s = ratio_spread.get(key)
        if s is not None and s["min"] > 1.0:
            flagged.append(
                f"{crossed} / sequential is above its ideal in every trial that measured it "
                f"(measured / ideal {s['median']:.3f}, lowest {s['min']:.3f}): the measurement "
                f"or the bound is wrong; do not trust this comparison's {crossed} ratios")
    return flagged


def verdict(result: Mapping[str, Any]) -> dict[str, Any]:
    """The planner's recommendation (the most frequent over trials) against the measured
    winner: validate.measured_winner on the median naive/sequential and the median
    crossover/naive (and crossover_turn/naive when it ran), the ratios the tables show (a
    ratio of two medians can disagree with the median of the per-trial ratio when trials are
    noisy). Each trial's own winner is counted beside it, so a winner that only some trials
    agree on reads as the noise it is."""
    per_trial = result.get("per_trial") or [result]
    predicted = collections.Counter(
        t["planner"]["recommendation"]["predicted"] for t in per_trial
        if "recommendation" in t.get("planner", {}))
    ratios = result["ratios"]
    winner = (measured_winner(_over_sequential(ratios, "over_naive"))
              if {"naive_over_sequential", "crossover_over_naive"} <= set(ratios) else None)
    trial_winners = collections.Counter(
        measured_winner(_over_sequential(t["ratios"], "over_sequential"))
        for t in per_trial
        if {"naive_over_sequential", "crossover_over_sequential"} <= set(t.get("ratios", {})))
    return {"predicted": predicted.most_common(1)[0][0] if predicted else None,
            "measured_winner": winner, "trial_winners": dict(trial_winners.most_common())}


def _over_sequential(ratios: Mapping[str, float], crossed_ratio: str) -> dict[str, float]:
    """Naive and each crossover scenario run (plain, and with link turns when it ran) over
    sequential, from the crossovers' ratios `crossed_ratio` ("over_naive": times the
    naive/sequential ratio; "over_sequential": as they are)."""
    naive = ratios["naive_over_sequential"]
    scale = naive if crossed_ratio == "over_naive" else 1.0
    return {"naive": naive, **{name: scale * ratios[f"{name}_{crossed_ratio}"]
                               for name in ("crossover", "crossover_turn")
                               if f"{name}_{crossed_ratio}" in ratios}}


def verdict_cells(chosen: Mapping[str, Any]) -> tuple[str, str]:
    """Markdown cells of a verdict: the recommendation, and the measured winner with how many
    trials it won (e.g. "cross (2 of 3 trials; naive 1)")."""
    winner = chosen.get("measured_winner")
    if not winner:
        return chosen.get("predicted") or "—", "—"
    counts = chosen.get("trial_winners") or {}
    if counts:
        others = "".join(f"; {w} {n}" for w, n in counts.items() if w != winner)
        winner += f" ({counts.get(winner, 0)} of {sum(counts.values())} trials{others})"
    return chosen.get("predicted") or "—", winner
