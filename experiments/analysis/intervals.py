"""Bootstrap 95% intervals on a comparison's ratios, and the call each interval makes.

Three trials' median [min–max] says how far the trials spread, not how far the median could
move by chance: with ~27 steps per window, one step is ~2% of a job's rate, as large as the
effects compared. The interval here resamples both sources of noise: the steps inside each
trial's measurement, and the trials themselves. Pure functions on per-trial summaries (the
per-step durations comparison.summary records as each scenario's step_s), seeded, so the
same compare.json always gives the same interval.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from crossover_tf_planner import registry
from crossover_tf_planner.compare_record import Interval, ScenarioResult, Trial

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


def rate_factors(scenario: ScenarioResult, sequential: bool, draws: int,
                 rng: np.random.Generator) -> np.ndarray:
    """Per draw, a scenario's resampled aggregate rate over its measured one. Concurrent jobs'
    rates add (each job's rate scales with 1 / its mean step); a sequential pair's rate is all
    images over all time (each job's time scales with its mean step). A job without steps
    (e.g. a summary without step data) contributes no noise."""
    step_s = scenario.step_s or {}
    factors, weights = [], []
    for job, durations in step_s.items():
        if len(durations) == 0:
            continue
        factors.append(resampled_means(durations, draws, rng) / float(np.mean(durations)))
        weights.append(float(np.sum(durations)) if sequential else scenario.job_rate(job))
    if not factors:
        return np.ones(draws)
    w = np.asarray(weights)[:, None]
    f = np.asarray(factors)
    if sequential:
        return w.sum() / (w * f).sum(axis=0)
    return (w / f).sum(axis=0) / w.sum()


def ratio_interval(per_trial: Sequence[Trial], key: str, draws: int = DRAWS,
                   seed: int = SEED) -> Interval | None:
    """The 95% percentile interval of the median over trials of ratio `key` (None where no
    trial measured both of its scenarios). Each draw perturbs every trial's paired ratio by
    its two scenarios' resampled rates (rate_factors), then takes the median of as many
    trials drawn with replacement. With one trial only the steps vary; with few trials the
    interval is wide, as it should be."""
    ratio = registry.RATIO_BY_KEY.get(key)  # None: not a ratio of two scenarios
    if ratio is None:
        return None
    top, bottom = ratio.top, ratio.bottom
    having = [t for t in per_trial if key in t.ratios
              and top in t.scenarios and bottom in t.scenarios]
    if not having:
        return None
    rng = np.random.default_rng(seed)
    paired = np.array([t.ratios[key]
                       * rate_factors(t.scenarios[top], top == registry.SEQUENTIAL, draws, rng)
                       / rate_factors(t.scenarios[bottom], bottom == registry.SEQUENTIAL, draws,
                                      rng)
                       for t in having])
    return _median_interval(paired, rng)


def over_ideal_interval(per_trial: Sequence[Trial], crossed: str, draws: int = DRAWS,
                        seed: int = SEED) -> Interval | None:
    """The 95% interval of a crossed scenario's measured / ideal (None where no trial has it).
    measured / ideal is the crossed rate over the ideal rate (analysis/ideal.py: the
    sequential rate cancels), so each draw perturbs only the crossed scenario's rate; the
    ideal, from the solo runs' means, is held fixed per trial."""
    key = registry.OVER_IDEAL[crossed].key
    having = [t for t in per_trial if key in t.ratios and crossed in t.scenarios]
    if not having:
        return None
    rng = np.random.default_rng(seed)
    paired = np.array([t.ratios[key] * rate_factors(t.scenarios[crossed], False, draws, rng)
                       for t in having])
    return _median_interval(paired, rng)


def _median_interval(paired: np.ndarray, rng: np.random.Generator) -> Interval:
    """The percentile interval of the median over trials: `paired` holds each trial's
    resampled values (trials x draws); each draw takes as many trials with replacement."""
    trials, draws = paired.shape
    picks = rng.integers(0, trials, size=(draws, trials))
    medians = np.median(paired[picks, np.arange(draws)[:, None]], axis=1)
    tail = 100 * (1 - LEVEL) / 2
    low, high = np.percentile(medians, [tail, 100 - tail])
    return Interval(float(low), float(high), LEVEL, trials, draws, METHOD)


def ratio_intervals(per_trial: Sequence[Trial]) -> dict[str, Interval]:
    """An interval for every ratio of two scenarios, and every crossed scenario's measured /
    ideal, that some trial measured."""
    found = {ratio.key: ratio_interval(per_trial, ratio.key) for ratio in registry.SCENARIO_RATIOS}
    found.update({metric.key: over_ideal_interval(per_trial, crossed)
                  for crossed, metric in registry.OVER_IDEAL.items()})
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


def ideal_call(low: float, high: float) -> str:
    """What a measured / ideal interval says: "above the ideal" only when it lies wholly above
    1 (comparison/trials.above_ideal flags it), else "within the ideal"."""
    return "above the ideal" if low > 1.0 else "within the ideal"


def describe(interval: Interval | None, digits: int = 3, judge: Callable[[float, float], str]
             = call) -> str:
    """"low–high (judgement)" of an interval (`judge`: call, or ideal_call for a measured /
    ideal), or "—" without one."""
    if not interval:
        return "—"
    return (f"{interval.low:.{digits}f}–{interval.high:.{digits}f} "
            f"({judge(interval.low, interval.high)})")
