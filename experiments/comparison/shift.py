"""The shift scenario's start shifts: job B starts its timed steps at the static shift that
CASSINI's rule (crossover_tf_planner/shift_rule.py) picks from the jobs' calibrated periods.

Why apart: the rule is the planner's, and the periods are the comparison's (its latest solo
runs, the ones the regime is held against); this module joins the two, once per run of the
scenario, so that the shift the jobs run is the one the planner predicts.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from crossover_tf_planner import registry
from crossover_tf_planner.job_stats import JobStats
from crossover_tf_planner.profile import profile_from_train_stats
from crossover_tf_planner.shift_rule import ShiftPlan, StepPhases, choose_shift

TrialStats = Mapping[str, Mapping[str, JobStats]]  # scenario -> job -> stats, of one trial


def phases(stats: JobStats) -> StepPhases:
    """A solo run's step as the rule lays it on the circle (the planner's profile of it)."""
    profile = profile_from_train_stats(stats)
    return StepPhases(profile.device_s, profile.comm_s, profile.other_s)


def latest_solos(done: Sequence[TrialStats]) -> Mapping[str, JobStats]:
    """The latest solo runs before now: this trial's sequential run if it came first, else the
    last trial's (trial 0 runs sequential first: SCENARIOS' order is its order)."""
    for trial in reversed(done):
        if registry.SEQUENTIAL in trial:
            return trial[registry.SEQUENTIAL]
    raise ValueError("the shift scenario needs the jobs' solo runs before it (run the "
                     "sequential scenario first)")


def start_shifts(solos: Mapping[str, JobStats]) -> tuple[dict[str, float], ShiftPlan]:
    """Each job's start shift (the first job 0, the second the rule's) and the rule's plan."""
    if len(solos) != 2:
        raise ValueError(f"the shift scenario runs two jobs, got {sorted(solos)}")
    first, second = solos  # job order
    plan = choose_shift(phases(solos[first]), phases(solos[second]))
    return {first: 0.0, second: plan.shift_s}, plan
