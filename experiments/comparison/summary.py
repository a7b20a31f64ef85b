"""One trial's summary from its jobs' stats: the scenario table and every registered ratio."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from absl import logging

from crossover_tf_planner import registry
from crossover_tf_planner.compare_record import IdealRound, Regime, ScenarioResult, Trial
from crossover_tf_planner.job_stats import JobStats
from experiments.analysis import ideal, throughput

Stats = Mapping[str, Mapping[str, JobStats]]  # scenario -> job -> its stats


def summarise(stats: Stats, warmup_steps: int, settings: Mapping[str, Any],
              regime: Regime | None = None) -> Trial:
    """Scenario table, ratios and the ideal ratio (analysis/ideal.py; the core's bound from
    `regime`'s comm-CPU probe, when it has one) from the per-job stats of each scenario; a
    ratio is there only when both of its scenarios ran and measured. Each measured scenario
    keeps step_s, per job the durations of the steps it was measured on, for the bootstrap
    interval (intervals.py). A concurrent scenario whose window is too short
    (throughput.WindowGuard), or during whose window the wall clock stepped, is left out of the
    table and every ratio, with the reason under invalid. The sanity bounds
    (analysis/bounds.py) judge the summary afterwards, on its numbers; kept apart, this
    arithmetic takes any hand-made numbers."""
    seq = stats[registry.SEQUENTIAL]
    table = {registry.solo(job): ScenarioResult({job: s}, s.images_per_s, {job: s.images_per_s})
             for job, s in seq.items()}
    sequential = throughput.sequential_aggregate(seq)
    total_images = sum(s.timed_images for s in seq.values())
    table[registry.SEQUENTIAL] = ScenarioResult(
        dict(seq), sequential,
        {job: sequential * s.timed_images / total_images for job, s in seq.items()},
        step_s={job: throughput.timed_step_durations(s, warmup_steps) for job, s in seq.items()})
    invalid: dict[str, str] = {}
    for name in registry.CONCURRENT:
        if name not in stats:
            continue
        try:
            table[name] = _concurrent(stats[name], warmup_steps)
        except throughput.WindowUnmeasurable as err:  # left out of every ratio below
            logging.warning("scenario %s is invalid: %s", name, err)
            invalid[name] = str(err)
    trial = Trial(table, settings=dict(settings), invalid=invalid)
    bound = ideal.ideal_round(trial, warmup_steps, regime)
    return dataclasses.replace(trial, ratios=_ratios(table, stats, warmup_steps, bound),
                               ideal=bound)


def _concurrent(jobs: Mapping[str, JobStats], warmup_steps: int) -> ScenarioResult:
    warmups = _warmups(jobs, warmup_steps)
    aggregate, per_job, window = throughput.concurrent_aggregate(
        jobs, warmups, share_exempt=[j for j, s in jobs.items() if s.priority == "secondary"])
    return ScenarioResult(dict(jobs), aggregate, per_job, window,
                          throughput.window_step_durations(jobs, warmups))


def _ratios(table: Mapping[str, ScenarioResult], stats: Stats, warmup_steps: int,
            bound: IdealRound) -> dict[str, float]:
    agg = {n: s.aggregate_images_per_s for n, s in table.items()}
    ratios = {r.key: agg[r.top] / agg[r.bottom] for r in registry.SCENARIO_RATIOS
              if r.top in agg and r.bottom in agg}
    seq = stats[registry.SEQUENTIAL]
    best = ratios[registry.IDEAL.key] = ideal.ideal_ratio(bound, agg[registry.SEQUENTIAL])
    for crossed, metric in registry.OVER_IDEAL.items():
        measured = registry.scenario_ratio(crossed, registry.SEQUENTIAL).key
        if measured in ratios:
            ratios[metric.key] = ratios[measured] / best
    if registry.PRIORITY in table:
        from experiments.analysis import priority_metrics
        naive = table.get(registry.NAIVE)
        ratios.update(priority_metrics.priority_ratios(
            stats[registry.PRIORITY], seq, table[registry.PRIORITY].per_job_in_aggregate,
            naive.per_job_in_aggregate if naive else None, warmup_steps))
    return ratios


def _warmups(jobs: Mapping[str, JobStats], warmup_steps: int) -> dict[str, int]:
    """Warm-up steps left out per job: a secondary runs only in the primary's gaps, so it
    starts stepping well after the primary; only its first (compiling) step is left out, or
    the primary could finish before the secondary's warm-up does."""
    return {job: min(1, warmup_steps) if s.priority == "secondary" else warmup_steps
            for job, s in jobs.items()}
