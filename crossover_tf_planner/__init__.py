"""Planner: predict whether pairing two jobs pays (crossover, shift, or not at all),
pair N jobs, simulate a cluster, sweep job shapes, validate against measurements.

Imports numpy and networkx (matplotlib only to draw the sweep); no TensorFlow, so a
scheduler can use it without installing the runtime (pip extra `planner`).

A scheduler's stable API is ``recommend(a, b, ...)`` (-> PairPrediction) and
``pair(jobs, ...)`` (-> PairingPlan): each job a JobProfile, JobStats, parsed JSON or the path of
a profile or stats.json (``JobInput``); both results have ``to_json``. ``crossover-plan``
(``python -m crossover_tf_planner``) is the same on the command line. The rule that picks a
recommendation from predicted throughputs is ``analytical.recommend``.
"""

from crossover_tf_planner.analytical import (PairPrediction, PairTimes, crossover_round_s,
                                             hyperperiod_s, normalised_throughput,
                                             policy_steps_per_s, predict_pair, predict_pairs)
from crossover_tf_planner.api import JobInput, as_profile, pair, recommend
from crossover_tf_planner.cluster_sim import (group_jobs, place, run_cluster,
                                              synthetic_profiles)
from crossover_tf_planner.fluid import colocated_steps_per_s
from crossover_tf_planner.comm_cost import LinkContention, load_link_contention
from crossover_tf_planner.job_stats import JobStats
from crossover_tf_planner.json_io import InputFileError
from crossover_tf_planner.pairing import PairingPlan, match_gains, plan_pairs
from crossover_tf_planner.policies import POLICIES, PREDICTED
from crossover_tf_planner.profile import (JobProfile, load_profile, load_profiles,
                                          profile_from_record, profile_from_train_stats)
from crossover_tf_planner.simulator import SimJob, SimResult, simulate
from crossover_tf_planner.sweep import SweepResult, run_sweep, save_heatmap
from crossover_tf_planner.validate import profiles_from_comparison, validate_comparison

__all__ = [
    "POLICIES", "PREDICTED", "InputFileError", "JobInput", "JobProfile", "JobStats",
    "LinkContention", "PairPrediction", "PairTimes", "PairingPlan", "SimJob", "SimResult",
    "SweepResult", "as_profile", "colocated_steps_per_s", "crossover_round_s", "group_jobs",
    "hyperperiod_s", "load_link_contention", "load_profile", "load_profiles", "match_gains",
    "normalised_throughput", "pair", "place", "plan_pairs", "policy_steps_per_s",
    "predict_pair", "predict_pairs", "profile_from_record", "profile_from_train_stats",
    "profiles_from_comparison", "recommend", "run_cluster", "run_sweep", "save_heatmap",
    "simulate", "synthetic_profiles", "validate_comparison",
]
