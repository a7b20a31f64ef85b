"""Per-trial sanity bounds: each trial's numbers held against what no schedule can beat, trial
by trial, as the window guard (throughput.WindowGuard) holds each concurrent window.

Why per trial: a fresh-clone main job reported, in one of its four trials, naive / sequential
2.014 and crossover with link turns / sequential 2.423 (measured / ideal 1.339), yet nothing
was refused or flagged: the ideal's check reads the median's interval, which the other trials
kept below 1, and that one trial widened every spread and moved the medians.

The bound: jobs running together never run faster than each runs alone, so a concurrent
scenario's aggregate rate is at most its jobs' solo rates summed (the ideal round,
analysis/ideal.py, is no faster). A trial whose concurrent scenario beats that sum by more than
the tolerance measured its solo runs too slow; its sequential run *is* those solo runs (its rate
is their images over their summed walls), so that trial's sequential run is refused, with the
reason, as the window guard refuses a concurrent scenario: it leaves the trial's table, and
every number resting on it (registry.ON_SEQUENTIAL: each ratio over sequential, the ideal,
measured / ideal) leaves the medians, intervals, verdict and plot. Ratios among the concurrent
scenarios never touch it and stay; so does the concurrent scenario, whose window the guard has
checked: a slowed baseline inflates every ratio over it alike, as it did there (naive and
crossover with link turns both above 2).

The tolerance, 5%: a ratio of one trial moves by chance about 1-2% (one step of the ~27 in a
window is ~2% of a job's rate, and the steps the window's edges cut count by their fraction;
the main job's 95% intervals span 2-4% either side over four trials), and the main job's best
trial stayed 8% under the bound (crossover with link turns / sequential 1.834, the two jobs'
solo rates summed being about twice the sequential rate).
"""
from __future__ import annotations

import dataclasses

from absl import logging

from crossover_tf_planner import registry
from crossover_tf_planner.compare_record import Trial


@dataclasses.dataclass(frozen=True)
class TrialBounds:
    """What one trial's numbers must satisfy to be believed (module docstring): no concurrent
    scenario's aggregate rate above its jobs' solo rates summed by more than
    `solo_sum_tolerance`."""
    solo_sum_tolerance: float = 0.05

    def violations(self, trial: Trial) -> list[str]:
        """One clause per concurrent scenario beyond the bound, with its numbers."""
        solo = {job: stats.images_per_s for job, stats in trial.solo_stats().items()}
        found = []
        for name in registry.CONCURRENT:
            scenario = trial.scenarios.get(name)
            if scenario is None:
                continue
            total = sum(solo[job] for job in scenario.jobs)
            excess = scenario.aggregate_images_per_s / total - 1
            if excess <= self.solo_sum_tolerance:
                continue
            over = trial.ratios.get(registry.Ratio(top=name, bottom=registry.SEQUENTIAL).key)
            found.append(
                f"{name} ran at {scenario.aggregate_images_per_s:.1f} images/s, {excess:.1%} "
                f"above its jobs' solo rates summed ("
                + " + ".join(f"{job} {solo[job]:.1f}" for job in scenario.jobs)
                + f" = {total:.1f})"
                + (f", {name} / sequential {over:.3f}" if over is not None else ""))
        return found


def judge(trial: Trial, bounds: TrialBounds = TrialBounds()) -> Trial:
    """The trial with its sequential run refused where a bound fails (out of its table and every
    number resting on it, the reason under invalid, as the window guard refuses a concurrent
    scenario); the trial itself where every bound holds."""
    found = bounds.violations(trial)
    if not found:
        return trial
    reason = (f"{'; '.join(found)}: beyond the {bounds.solo_sum_tolerance:.0%} allowed for "
              "noise. Jobs running together never beat each running alone, so this trial's "
              "solo runs, its sequential run, were slowed: its ratios over sequential, its "
              "ideal and its measured / ideal are left out")
    logging.warning("trial %s: sequential is invalid: %s", trial.settings.get("trial"), reason)
    return dataclasses.replace(
        trial, scenarios={n: s for n, s in trial.scenarios.items() if n != registry.SEQUENTIAL},
        ratios={k: v for k, v in trial.ratios.items() if k not in registry.ON_SEQUENTIAL},
        invalid={**trial.invalid, registry.SEQUENTIAL: reason})
