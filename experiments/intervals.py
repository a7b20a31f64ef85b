"""Bootstrap 95% intervals on a comparison's ratios, and the call each interval makes.

Three trials' median [min–max] says how far the trials spread, not how far the median could
move by chance: with ~27 steps per window, one step is ~2% of a job's rate, as large as the
effects compared. The interval here resamples both sources of noise: the steps inside each
trial's measurement, and the trials themselves. Pure functions on per-trial summaries (the
per-step durations compare.summarise records as each scenario's "step_s"), seeded, so the
same compare.json always gives the same interval.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

DRAWS = 2000
SEED = 0
LEVEL = 0.95
# A step up (naive over sequential, crossing over naive) must gain at least this much at the
# low end of its interval to count as a win: a 1% gain is not worth a scheduler's trouble.
WIN_BAR = 0.01
METHOD = ("paired per trial (both scenarios of a ratio from the same trial); moving-block "
          "bootstrap over each job's step durations in its measured window, then trials "
          "resampled; the median over trials; percentile interval")


def block_length(steps: int) -> int:
    """Moving-block length ~ n^(1/3) (the usual rate for a mean): consecutive steps are
    correlated (a slow second slows a few steps), which single-step resampling would hide."""
    return max(1, min(steps, round(steps ** (1 / 3))))


def resampled_means(durations: Sequence[float], draws: int, rng: np.random.Generator
                    ) -> np.ndarray:
    """`draws` moving-block bootstrap means of one job's step durations."""
    d = np.asarray(durations, dtype=float)
    n = len(d)
    length = block_length(n)
    starts = rng.integers(0, n - length + 1, size=(draws, -(-n // length)))
    picks = (starts[..., None] + np.arange(length)).reshape(draws, -1)[:, :n]
    return d[picks].mean(axis=1)


def rate_factors(scenario: Mapping[str, Any], sequential: bool, draws: int,
                 rng: np.random.Generator) -> np.ndarray:
    """Per draw, a scenario's resampled aggregate rate over its measured one. Concurrent jobs'
    rates add (each job's rate scales with 1 / its mean step); a sequential pair's rate is all
    images over all time (each job's time scales with its mean step). A job without steps
    (e.g. a summary without step data) contributes no noise."""
    step_s = scenario.get("step_s") or {}
    rates = scenario["per_job_in_aggregate"]
    factors, weights = [], []
    for job, durations in step_s.items():
        if len(durations) == 0:
            continue
        factors.append(resampled_means(durations, draws, rng) / float(np.mean(durations)))
        weights.append(float(np.sum(durations)) if sequential else float(rates[job]))
    if not factors:
        return np.ones(draws)
    w = np.asarray(weights)[:, None]
    f = np.asarray(factors)
    if sequential:
        return w.sum() / (w * f).sum(axis=0)
    return (w / f).sum(axis=0) / w.sum()


def scenario_pair(key: str) -> tuple[str, str] | None:
    """The scenarios a ratio key compares ("crossover_over_naive" -> crossover, naive)."""
    top, sep, bottom = key.partition("_over_")
    return (top, bottom) if sep and top and bottom else None


def ratio_interval(per_trial: Sequence[Mapping[str, Any]], key: str, draws: int = DRAWS,
                   seed: int = SEED) -> dict[str, Any] | None:
    """The 95% percentile interval of the median over trials of ratio `key` (None where no
    trial measured both of its scenarios). Each draw perturbs every trial's paired ratio by
    its two scenarios' resampled rates (rate_factors), then takes the median of as many
    trials drawn with replacement. With one trial only the steps vary; with few trials the
    interval is wide, as it should be."""
    pair = scenario_pair(key)
    if pair is None:
        return None
    top, bottom = pair
    having = [t for t in per_trial if key in t.get("ratios", {})
              and top in t["scenarios"] and bottom in t["scenarios"]]
    if not having:
        return None
    rng = np.random.default_rng(seed)
    paired = np.array([t["ratios"][key]
                       * rate_factors(t["scenarios"][top], top == "sequential", draws, rng)
                       / rate_factors(t["scenarios"][bottom], bottom == "sequential", draws, rng)
                       for t in having])
    picks = rng.integers(0, len(having), size=(draws, len(having)))
    medians = np.median(paired[picks, np.arange(draws)[:, None]], axis=1)
    tail = 100 * (1 - LEVEL) / 2
    low, high = np.percentile(medians, [tail, 100 - tail])
    return {"low": float(low), "high": float(high), "level": LEVEL, "trials": len(having),
            "draws": draws, "method": METHOD}


def ratio_intervals(per_trial: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """An interval for every ratio of two scenarios that some trial measured."""
    keys = dict.fromkeys(k for t in per_trial for k in t.get("ratios", {}))
    found = {key: ratio_interval(per_trial, key) for key in keys}
    return {key: interval for key, interval in found.items() if interval is not None}


def call(low: float, high: float, bar: float = WIN_BAR) -> str:
    """What an interval says of top against bottom: "win" when it lies at or above 1 + bar,
    "loss" at or below 1 / (1 + bar), "tie" when it includes 1.0 (no difference shown), and
    "too close to call" when it excludes 1.0 by less than the bar."""
    if low >= 1 + bar:
        return "win"
    if high <= 1 / (1 + bar):
        return "loss"
    if low <= 1.0 <= high:
        return "tie"
    return "too close to call"


def describe(interval: Mapping[str, Any] | None, digits: int = 3) -> str:
    """"low–high (call)" of an interval, or "—" without one."""
    if not interval:
        return "—"
    return (f"{interval['low']:.{digits}f}–{interval['high']:.{digits}f} "
            f"({call(interval['low'], interval['high'])})")
