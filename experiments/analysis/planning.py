"""The planner's predictions for a comparison's trials, from their solo profiles and regime
only: what compare.py attaches when it runs and replan.py recomputes on saved results."""
from __future__ import annotations

import dataclasses

from absl import logging

from crossover_tf_planner import registry
from crossover_tf_planner.comparison import Comparison, Regime, Trial


def plan_trials(result: Comparison) -> Comparison:
    """The comparison with the planner's check of every trial; its own planner is the
    representative trial's."""
    per_trial = [with_planner(t, result.regime) for t in result.per_trial]
    chosen = per_trial[result.representative_trial] if per_trial else None
    planner = chosen.planner if chosen and chosen.planner is not None else result.planner
    return dataclasses.replace(result, per_trial=per_trial, planner=planner)


def with_planner(trial: Trial, regime: Regime | None = None) -> Trial:
    """The trial with the planner's predictions for its jobs, from the solo profiles only,
    with % errors (unchanged where it lacks naive or crossover, or the planner cannot model
    it)."""
    if not {registry.NAIVE, registry.CROSSOVER} <= set(trial.scenarios):
        return trial
    from crossover_tf_planner import validate as planner_validate
    try:
        report = planner_validate.validate_comparison(trial, regime=regime)
    except ValueError as err:  # e.g. a scenario the planner cannot model
        logging.warning("planner validation skipped: %s", err)
        return trial
    return dataclasses.replace(trial, planner=report)
