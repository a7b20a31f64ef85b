"""The planner's predictions for a comparison's trials, from their solo profiles and regime
only: what compare.py attaches when it runs and replan.py recomputes on saved results."""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from absl import logging

from crossover_tf_planner import registry
from crossover_tf_planner.compare_record import Comparison, Regime, Trial


def plan_trials(result: Comparison) -> Comparison:
    """The comparison with the planner's check of every trial; its own planner is the
    representative trial's, and its recommendation (the comparison's: recommendation) comes
    from each job's median solo run over the trials checked, where there are two or more."""
    per_trial = [with_planner(t, result.regime) for t in result.per_trial]
    chosen = per_trial[result.representative_trial] if per_trial else None
    planner = chosen.planner if chosen and chosen.planner is not None else result.planner
    pooled = median_solo_recommendation(per_trial, result.regime)
    if planner is not None and pooled is not None:
        planner = {**planner, "recommendation": {**planner["recommendation"], **pooled}}
    return dataclasses.replace(result, per_trial=per_trial, planner=planner)


def median_solo_recommendation(per_trial: Sequence[Trial], regime: Regime | None
                               ) -> dict[str, Any] | None:
    """The planner's pick from each job's median solo run (by mean step) over the trials it
    checked, and which trial each came from. Why: one trial's solo run can be slow for reasons
    of the machine's (the main job of 2026-12-04: job A's C was 692 ms in the shown trial
    against 540-603 in the others), and a recommendation from that trial alone followed it.
    None with fewer than two such trials, or where the planner cannot model them."""
    checked = [(i, t) for i, t in enumerate(per_trial) if t.planner is not None]
    if len(checked) < 2:
        return None
    first = checked[0][1]
    chosen: dict[str, int] = {}
    for job in first.solo_stats():
        steps = sorted((_mean_step_s(t.solo_stats()[job]), i) for i, t in checked)
        chosen[job] = steps[(len(steps) - 1) // 2][1]
    scenarios = {**first.scenarios, **{registry.solo(job): per_trial[i].scenarios[
        registry.solo(job)] for job, i in chosen.items()}}
    from crossover_tf_planner import validate as planner_validate
    try:
        report = planner_validate.validate_comparison(
            dataclasses.replace(first, scenarios=scenarios), regime=regime)
    except ValueError as err:
        logging.warning("no recommendation from the median solo runs: %s", err)
        return None
    return {"predicted": report["recommendation"]["predicted"], "solo_runs": chosen}


def _mean_step_s(stats: Any) -> float:
    return stats.timed_wall_s / stats.timed_steps if stats.timed_steps else stats.step_time_s


def recommendation(result: Comparison) -> str | None:
    """The planner's one recommendation for a comparison, computed once: its prediction from
    each job's median solo run over the trials checked (or, with one trial, the representative
    trial's) and the probes (result.planner; in a record without it, that trial's own check).
    Every trial's check predicts from its own solo runs, and those
    can differ; compare.md prints this one as the recommendation and the others as checks,
    never a vote among them. None without a planner."""
    report = result.planner
    if report is None and result.per_trial:
        report = result.per_trial[result.representative_trial].planner
    return (report or {}).get("recommendation", {}).get("predicted")


def with_planner(trial: Trial, regime: Regime | None = None) -> Trial:
    """The trial with the planner's predictions for its jobs, from the solo profiles only,
    with % errors (unchanged where it lacks naive or both crossings, crossover and
    crossover_turn, or the planner cannot model it, or its sequential run was refused:
    analysis/bounds.py found its solo runs, the planner's inputs, slowed; or it ran out of the
    regime, analysis/regime.judge, and its measured ratios are left out of the calls the
    planner is checked against)."""
    if (not {registry.SEQUENTIAL, registry.NAIVE} <= set(trial.scenarios)
            or not set(registry.CROSSED) & set(trial.scenarios)
            or registry.OUT_OF_REGIME in trial.invalid):
        return trial
    from crossover_tf_planner import validate as planner_validate
    try:
        report = planner_validate.validate_comparison(trial, regime=regime)
    except ValueError as err:  # e.g. a scenario the planner cannot model
        logging.warning("planner validation skipped: %s", err)
        return trial
    return dataclasses.replace(trial, planner=report)
