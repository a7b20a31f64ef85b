"""Repeated trials of a comparison: balanced order, median with min/max per ratio, a bootstrap
interval per ratio, and the verdict it supports.

One run of each scenario says little on a shared machine: a slow minute lands on whichever
scenario ran then. Running every scenario once per trial, in the orders of a Williams design
(each scenario in each position, and after each other, equally often), lets drift hit all
scenarios alike; the spread across trials and the bootstrap interval (intervals.py) say how
far a ratio can be trusted.
"""
from __future__ import annotations

import collections
import statistics
from typing import Any, Mapping, Sequence

from crossover_tf_planner.validate import measured_winner
from crossover_tf_planner.job_stats import JobStats
from experiments import intervals

# The ratio that picks the representative trial (the one whose scenarios compare.json shows).
PRIMARY_RATIO = "crossover_over_naive"
# Each crossed scenario's measured/ideal ratio: its <scenario>_over_sequential over the ideal.
OVER_IDEAL = {"crossover": "measured_over_ideal",
              "crossover_turn": "crossover_turn_measured_over_ideal"}


def williams_square(n: int) -> list[list[int]]:
    """A Williams design of n treatments: rows in which every treatment takes every position
    equally often and every ordered pair is adjacent equally often, so neither a slow end of
    the experiment nor the scenario just before lands on one scenario more than another.
    Row 0 is 0, 1, n-1, 2, n-2, ...; row i adds i (mod n); the treatments are then relabelled
    so that row 0 is the given order. For an odd n no single square balances the pairs: the n
    mirrored rows follow (2n rows, each pair adjacent twice). The first n rows are a Latin
    square either way."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    label = {x: position for position, x in enumerate(first)}  # relabelled: row 0 = 0..n-1
    rows = [[label[(x + i) % n] for x in first] for i in range(n)]
    return rows + [row[::-1] for row in rows] if n % 2 and n > 1 else rows


def trial_order(scenarios: Sequence[str], trial: int) -> list[str]:
    """Scenario order of one trial: row `trial` of the Williams design (cycled)."""
    rows = williams_square(len(scenarios))
    return [scenarios[i] for i in rows[trial % len(rows)]]


def trial_orders(scenarios: Sequence[str], trials: int) -> list[list[str]]:
    """The scenario order of every trial (trial_order for 0..trials-1)."""
    return [trial_order(scenarios, trial) for trial in range(trials)]


def order_design(scenarios: Sequence[str], trials: int) -> dict[str, Any]:
    """What the trials' orders balance: positions need a multiple of the scenario count,
    adjacent pairs a multiple of the design's rows (n, or 2n for an odd n). Any trial count
    runs (a multiple can cost several more runs of every scenario); the record, and
    compare.md, say what is then left unbalanced."""
    n, rows = len(scenarios), len(williams_square(len(scenarios)))
    return {"design": "williams", "rows": rows, "trials": trials,
            "positions_balanced": trials % n == 0, "adjacency_balanced": trials % rows == 0}


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
    "ratios" as medians over the trials that measured them with "ratio_spread" and the
    bootstrap "ratio_interval" (intervals.py) beside them, "invalid" (per scenario, the
    trials it was refused in and why), "checks" (what failed a sanity check, e.g. a measured
    ratio above its ideal), and every trial."""
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
            "ratio_spread": ratio_spread, "ratio_interval": intervals.ratio_intervals(per_trial),
            "invalid": invalid,
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


VERDICT_RULE = (
    "Verdict rule: from one job after the other (do not pair) to naive to crossing (the "
    "faster of crossover and crossover_turn), a step up is a **win** when the 95% bootstrap "
    f"interval of its ratio over the current choice lies at or above {1 + intervals.WIN_BAR:g}; "
    "a **tie** (the simpler stays) when the interval includes 1.0; **too close to call** (the "
    f"simpler stays) when it excludes 1.0 by less than {intervals.WIN_BAR:.0%}. Without an "
    "interval the median stands in for it.")
# The ladder the measured verdict climbs: (verdict, scenario).
LADDER = (("do not pair", "sequential"), ("naive", "naive"))
CROSSED = ("crossover", "crossover_turn")


def verdict(result: Mapping[str, Any]) -> dict[str, Any]:
    """The planner's recommendation (the most frequent over trials) against the measured
    winner by VERDICT_RULE, on the median ratios the tables show and their intervals; each
    step's call is kept ("steps"). Each trial's faster policy (validate.measured_winner with
    no bar) is counted beside it. The measured winner is None without naive/sequential and
    crossover/naive."""
    per_trial = result.get("per_trial") or [result]
    predicted = collections.Counter(
        t["planner"]["recommendation"]["predicted"] for t in per_trial
        if "recommendation" in t.get("planner", {}))
    ratios = result["ratios"]
    winner, steps = None, []
    if {"naive_over_sequential", "crossover_over_naive"} <= set(ratios):
        winner, steps = _climb(result)
    trial_winners = collections.Counter(
        measured_winner(_over_sequential(t["ratios"]), min_gain=0.0)
        for t in per_trial
        if {"naive_over_sequential", "crossover_over_sequential"} <= set(t.get("ratios", {})))
    return {"predicted": predicted.most_common(1)[0][0] if predicted else None,
            "measured_winner": winner, "steps": steps,
            "trial_winners": dict(trial_winners.most_common())}


def _climb(result: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """VERDICT_RULE's ladder: the verdict and every step's ratio, interval and call."""
    ratios, found = result["ratios"], result.get("ratio_interval") or {}
    choice, current = LADDER[0]
    steps = []
    crossed = max((c for c in CROSSED if f"{c}_over_naive" in ratios),
                  key=lambda c: ratios[f"{c}_over_naive"])
    for candidate, scenario in (LADDER[1], ("cross", crossed)):
        key = f"{scenario}_over_{current}"
        if key not in ratios:
            continue
        steps.append(_step(key, ratios[key], found.get(key)))
        if steps[-1]["call"] == "win":
            choice, current = candidate, scenario
    return choice, steps


def _step(key: str, median: float, interval: Mapping[str, Any] | None) -> dict[str, Any]:
    """One step of the ladder: its ratio's median, interval and call; without an interval
    (a hand-made or pre-interval result) the median is both ends, and "interval" says so."""
    low, high = (interval["low"], interval["high"]) if interval else (median, median)
    return {"ratio": key, "median": median, "low": low, "high": high,
            "interval": interval is not None, "call": intervals.call(low, high)}


def _over_sequential(ratios: Mapping[str, float]) -> dict[str, float]:
    """Naive and each crossover scenario run (plain, and with link turns when it ran) over
    sequential, as one trial measured them."""
    return {"naive": ratios["naive_over_sequential"],
            **{name: ratios[f"{name}_over_sequential"] for name in CROSSED
               if f"{name}_over_sequential" in ratios}}


def verdict_cells(chosen: Mapping[str, Any]) -> tuple[str, str]:
    """Markdown cells of a verdict: the recommendation, and the measured winner with each
    step's call (e.g. "cross (crossover / naive 1.046 [95% 1.012–1.081]: win; faster per
    trial: cross 3)")."""
    winner = chosen.get("measured_winner")
    if not winner:
        return chosen.get("predicted") or "—", "—"
    calls = [f"{s['ratio'].replace('_over_', ' / ')} {s['median']:.3f} "
             + (f"[95% {s['low']:.3f}–{s['high']:.3f}]" if s["interval"] else "[no interval]")
             + f": {s['call']}" for s in chosen.get("steps", ())]
    counts = chosen.get("trial_winners") or {}
    if counts:
        calls.append("faster per trial: " + ", ".join(f"{w} {n}" for w, n in counts.items()))
    return chosen.get("predicted") or "—", f"{winner} ({'; '.join(calls)})" if calls else winner
