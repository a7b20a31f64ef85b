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
import dataclasses
import statistics
from typing import Any, Mapping, Sequence

from crossover_tf_planner import registry
from crossover_tf_planner.compare_record import (Comparison, Interval, InvalidRun, OrderDesign,
                                             Spread, Trial)
from crossover_tf_planner.validate import measured_winner
from experiments.analysis import intervals, planning


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


def order_design(scenarios: Sequence[str], trials: int) -> OrderDesign:
    """What the trials' orders balance: positions need a multiple of the scenario count,
    adjacent pairs a multiple of the design's rows (n, or 2n for an odd n). Any trial count
    runs (a multiple can cost several more runs of every scenario); the record, and
    compare.md, say what is then left unbalanced."""
    n, rows = len(scenarios), len(williams_square(len(scenarios)))
    return OrderDesign("williams", rows, trials, trials % n == 0, trials % rows == 0)


def spread(values: Sequence[float], trials: int | None = None) -> Spread:
    """Median, min, max and the per-trial values; `trials` (when more trials ran than gave a
    value, e.g. a scenario invalid in some) is kept as of_trials so the count stays shown."""
    return Spread(statistics.median(values), min(values), max(values), list(values),
                  trials if trials is not None and trials != len(values) else None)


def regime_solos(solos: Mapping[str, Any], settings: Mapping[str, Any]) -> list[Any]:
    """The solo runs the M/C regime is measured on: every job's; job A's alone where job B
    is shaped to another period (--period_ratio: B's C is then not the one calibrated)."""
    return [solos["A"]] if settings.get("period_ratio") else list(solos.values())


def comm_to_compute(trial: Trial | Comparison) -> float:
    """M/C of one trial from its solo profiles (regime_solos): total allreduce over total
    device time."""
    solos = regime_solos(trial.solo_stats(), trial.settings)
    return sum(s.comm_s for s in solos) / sum(s.device_s for s in solos)


def representative_trial(per_trial: Sequence[Trial]) -> int:
    """Index of the trial whose primary ratio is the (lower) median, among the trials whose
    sequential run stands when any does (a trial's shown tables and the planner's check rest
    on it; analysis/bounds.py refuses it in some); trial 0 when the comparison has no such
    ratio (e.g. without the naive scenario)."""
    key = registry.PRIMARY_RATIO.key
    having = [i for i, t in enumerate(per_trial) if key in t.ratios]
    having = [i for i in having if registry.SEQUENTIAL in per_trial[i].scenarios] or having
    if not having:
        return 0
    ranked = sorted(having, key=lambda i: per_trial[i].ratios[key])
    return ranked[(len(ranked) - 1) // 2]


def combine(per_trial: Sequence[Trial]) -> Comparison:
    """The comparison from per-trial summaries: the representative trial's scenarios, ratios
    as medians over the trials that measured them with their spread and the bootstrap
    interval (intervals.py) beside them, invalid (per scenario, the trials it was refused in
    and why), checks (what failed a sanity check: a measured ratio above its ideal, over all
    trials or in one), and every trial. A trial whose own check failed is left out of the
    medians, spreads and intervals of every ratio the check puts in doubt (left_out_ratios;
    the record's left_out names them), and its own ratios stay in per_trial as measured."""
    if not per_trial:
        raise ValueError("no trials to combine")
    flagged = trials_above_ideal(per_trial)
    left_out = left_out_ratios(per_trial, flagged)
    counted = [dataclasses.replace(t, ratios={k: v for k, v in t.ratios.items()
                                              if index not in left_out.get(k, ())})
               for index, t in enumerate(per_trial)]
    chosen = representative_trial(counted)
    names = list(dict.fromkeys(name for t in per_trial for name in t.ratios))
    ratio_spread = {name: spread([t.ratios[name] for t in counted if name in t.ratios],
                                 trials=len(per_trial)) for name in names
                    if any(name in t.ratios for t in counted)}
    invalid: dict[str, list[InvalidRun]] = {}
    for trial, t in enumerate(per_trial):
        for name, reason in t.invalid.items():
            invalid.setdefault(name, []).append(InvalidRun(trial, reason))
    found = intervals.ratio_intervals(counted)
    return Comparison(
        per_trial[chosen].scenarios, {name: s.median for name, s in ratio_spread.items()},
        trials=len(per_trial), representative_trial=chosen, ratio_spread=ratio_spread,
        ratio_interval=found, invalid=invalid,
        checks=above_ideal(ratio_spread, found) + [check.message for check in flagged],
        achieved_comm_to_compute=spread([comm_to_compute(t) for t in per_trial]),
        per_trial=list(per_trial), ideal=per_trial[chosen].ideal, left_out=left_out)


def above_ideal(ratio_spread: Mapping[str, Spread],
                ratio_interval: Mapping[str, Interval] | None = None) -> list[str]:
    """A crossed scenario whose measured / ideal lies above 1 beyond its 95% interval (the
    interval's low end above 1; without an interval, every trial above 1): the ideal is an
    upper bound (analysis/ideal.py), so the measurement or the bound is wrong. A median above
    1 whose interval includes 1 is noise, not flagged."""
    flagged = []
    for crossed, metric in registry.OVER_IDEAL.items():
        s, found = ratio_spread.get(metric.key), (ratio_interval or {}).get(metric.key)
        if s is None:
            continue
        if found is not None and found.low > 1.0:
            beyond = f"its 95% interval {found.low:.3f}–{found.high:.3f} lies wholly above 1"
        elif found is None and s.min > 1.0:
            beyond = f"no interval; above 1 in every trial, lowest {s.min:.3f}"
        else:
            continue
        flagged.append(_above_ideal(crossed, s.median, beyond, "this comparison"))
    return flagged


@dataclasses.dataclass(frozen=True)
class TrialCheck:
    """One trial's crossed scenario above its ideal beyond the trial's own interval."""
    trial: int
    crossed: str
    message: str


def trials_above_ideal(per_trial: Sequence[Trial]) -> list[TrialCheck]:
    """Each trial of several whose measured / ideal lies above 1 beyond its own 95% interval
    (its steps resampled, intervals.over_ideal_interval), named: one such trial moves the
    median and widens the spread without lifting the median's interval above 1, so above_ideal
    alone would let it pass (a single trial's comparison is above_ideal's already)."""
    if len(per_trial) < 2:
        return []
    flagged = []
    for index, trial in enumerate(per_trial):
        for crossed, metric in registry.OVER_IDEAL.items():
            found = intervals.over_ideal_interval([trial], crossed)
            if found is not None and found.low > 1.0:
                beyond = (f"this trial's 95% interval {found.low:.3f}–{found.high:.3f} lies "
                          "wholly above 1")
                flagged.append(TrialCheck(index, crossed, f"trial {index}: " + _above_ideal(
                    crossed, trial.ratios[metric.key], beyond, f"trial {index}")))
    return flagged


def left_out_ratios(per_trial: Sequence[Trial], flagged: Sequence[TrialCheck]
                    ) -> dict[str, list[int]]:
    """Per ratio, the trials a failed check leaves out of it. "The measurement or the bound
    is wrong", and a check cannot tell which: so both go, the bound's (every number resting on
    the trial's solo runs: registry.ON_SEQUENTIAL, as analysis/bounds.py refuses a slowed
    sequential run) and the crossed scenario's (every ratio it is part of). The trial's other
    ratios (e.g. naive against another crossed scenario) stay. Where every trial that measured
    a ratio failed, none is left out of it: the bias is the comparison's, and above_ideal
    flags it over all trials."""
    left_out: dict[str, list[int]] = {}
    for check in flagged:
        doubted = set(registry.ON_SEQUENTIAL) | {
            key for key in per_trial[check.trial].ratios
            if (ratio := registry.RATIO_BY_KEY.get(key)) is not None
            and check.crossed in (ratio.top, ratio.bottom)}
        for key in sorted(doubted & set(per_trial[check.trial].ratios)):
            trials = left_out.setdefault(key, [])
            if check.trial not in trials:
                trials.append(check.trial)
    return {key: trials for key, trials in left_out.items()
            if len(trials) < sum(key in t.ratios for t in per_trial)}


def _above_ideal(crossed: str, value: float, beyond: str, whose: str) -> str:
    """The sentence flagging a crossed scenario above its ideal (`whose` ratios not to trust)."""
    return (f"{crossed} / sequential is above its ideal (measured / ideal {value:.3f}; "
            f"{beyond}): the measurement or the bound is wrong; do not trust {whose}'s "
            f"{crossed} ratios")


VERDICT_RULE = (
    "Verdict rule: from one job after the other (do not pair) to naive to crossing (the "
    "faster of crossover and crossover_turn), a step up is a **win** when the 95% bootstrap "
    f"interval of its ratio over the current choice lies at or above {1 + intervals.WIN_BAR:g}; "
    "a **tie** (the simpler stays) when the interval includes 1.0; **too close to call** (the "
    f"simpler stays) when it excludes 1.0 by less than {intervals.WIN_BAR:.0%}. Without an "
    "interval the median stands in for it.")
# The ladder the measured verdict climbs: (verdict, scenario).
LADDER = (("do not pair", registry.SEQUENTIAL), ("naive", registry.NAIVE))


def verdict(result: Comparison) -> dict[str, Any]:
    """The planner's one recommendation (planning.recommendation) against the measured winner
    by VERDICT_RULE, on the median ratios the tables show and their intervals; each step's
    call is kept ("steps"). Each trial's faster policy (validate.measured_winner with no bar)
    is counted beside it. The measured winner is None without naive/sequential and a crossing
    over naive (crossover/naive or crossover_turn/naive)."""
    per_trial = result.trials_or_self
    ratios = result.ratios
    winner, steps = None, []
    crossed_over_naive = {registry.scenario_ratio(c, registry.NAIVE).key
                          for c in registry.CROSSED}
    if registry.NAIVE_OVER_SEQUENTIAL.key in ratios and crossed_over_naive & set(ratios):
        winner, steps = _climb(result)
    crossed_over_sequential = {registry.scenario_ratio(c, registry.SEQUENTIAL).key
                               for c in registry.CROSSED}
    trial_winners = collections.Counter(
        measured_winner(_over_sequential(t.ratios), min_gain=0.0) for t in per_trial
        if registry.NAIVE_OVER_SEQUENTIAL.key in t.ratios
        and crossed_over_sequential & set(t.ratios))
    return {"predicted": planning.recommendation(result),
            "measured_winner": winner, "steps": steps,
            "trial_winners": dict(trial_winners.most_common())}


def _climb(result: Comparison) -> tuple[str, list[dict[str, Any]]]:
    """VERDICT_RULE's ladder: the verdict and every step's ratio, interval and call."""
    ratios, found = result.ratios, result.ratio_interval
    choice, current = LADDER[0]
    steps = []
    over_naive = {c: registry.scenario_ratio(c, registry.NAIVE).key for c in registry.CROSSED}
    crossed = max((c for c in registry.CROSSED if over_naive[c] in ratios),
                  key=lambda c: ratios[over_naive[c]])
    for candidate, scenario in (LADDER[1], ("cross", crossed)):
        key = registry.scenario_ratio(scenario, current).key
        if key not in ratios:
            continue
        steps.append(_step(key, ratios[key], found.get(key)))
        if steps[-1]["call"] == "win":
            choice, current = candidate, scenario
    return choice, steps


def _step(key: str, median: float, interval: Interval | None) -> dict[str, Any]:
    """One step of the ladder: its ratio's median, interval and call; without an interval
    (a hand-made or pre-interval result) the median is both ends, and "interval" says so."""
    low, high = (interval.low, interval.high) if interval else (median, median)
    return {"ratio": key, "median": median, "low": low, "high": high,
            "interval": interval is not None, "call": intervals.call(low, high)}


def _over_sequential(ratios: dict[str, float]) -> dict[str, float]:
    """Naive and each crossover scenario run (plain, and with link turns when it ran) over
    sequential, as one trial measured them."""
    over = {name: registry.scenario_ratio(name, registry.SEQUENTIAL).key
            for name in (registry.NAIVE, *registry.CROSSED)}
    return {name: ratios[key] for name, key in over.items() if key in ratios}


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
