"""The planner's predictions for a comparison's trials, from their solo profiles and regime
only: what compare.py attaches when it runs and replan.py recomputes on saved results."""
from __future__ import annotations

import dataclasses

from absl import logging

from crossover_tf_planner import registry
from crossover_tf_planner.compare_record import Comparison, Regime, Trial


def plan_trials(result: Comparison) -> Comparison:
    """The comparison with the planner's check of every trial; its own planner is the
    representative trial's, whose recommendation is the comparison's (recommendation)."""
    per_trial = [with_planner(t, result.regime) for t in result.per_trial]
    chosen = per_trial[result.representative_trial] if per_trial else None
    planner = chosen.planner if chosen and chosen.planner is not None else result.planner
    return dataclasses.replace(result, per_trial=per_trial, planner=planner)


def recommendation(result: Comparison) -> str | None:
    """The planner's one recommendation for a comparison, computed once: its prediction from
    the representative trial's solo runs and the probes (result.planner; in a record without
    it, that trial's own check). Every trial's check predicts from its own solo runs, and those
    can differ; compare.md prints this one as the recommendation and the others as checks,
    never a vote among them. None without a planner."""
    report = result.planner
    if report is None and result.per_trial:
        report = result.per_trial[result.representative_trial].planner
    return (report or {}).get("recommendation", {}).get("predicted")


def with_planner(trial: Trial, regime: Regime | None = None) -> Trial:
    """The trial with the planner's predictions for its jobs, from the solo profiles only,
    with % errors (unchanged where it lacks naive or crossover, or the planner cannot model
    it, or its sequential run was refused: analysis/bounds.py found its solo runs, the
    planner's inputs, slowed; or it ran out of the regime, analysis/regime.judge, and its
    measured ratios are left out of the calls the planner is checked against)."""
    if (not {registry.SEQUENTIAL, registry.NAIVE, registry.CROSSOVER} <= set(trial.scenarios)
            or registry.OUT_OF_REGIME in trial.invalid):
        return trial
    from crossover_tf_planner import validate as planner_validate
    try:
        report = planner_validate.validate_comparison(trial, regime=regime)
    except ValueError as err:  # e.g. a scenario the planner cannot model
        logging.warning("planner validation skipped: %s", err)
        return trial
    return dataclasses.replace(trial, planner=report)
