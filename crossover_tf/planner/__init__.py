"""Planner: predict whether pairing two jobs pays (crossover, shift, or not at all),
pair N jobs, simulate a cluster, sweep job shapes, validate against measurements.

Imports numpy, networkx and matplotlib (Agg) only; no TensorFlow.
"""

from crossover_tf.planner.analytical import (POLICIES, PREDICTED, PairPrediction, PairTimes,
                                             crossover_round_s, hyperperiod_s,
                                             normalised_throughput, policy_steps_per_s,
                                             predict_pair, predict_pairs, recommend)
from crossover_tf.planner.cluster import group_jobs, place, run_cluster, synthetic_profiles
from crossover_tf.planner.fluid import colocated_steps_per_s
from crossover_tf.planner.pairing import PairingPlan, match_gains, plan_pairs
from crossover_tf.planner.profile import JobProfile, load_profiles, profile_from_train_stats
from crossover_tf.planner.simulator import SimJob, SimResult, simulate
from crossover_tf.planner.sweep import SweepResult, run_sweep, save_heatmap
from crossover_tf.planner.validate import profiles_from_comparison, validate_comparison

__all__ = [
    "POLICIES", "PREDICTED", "JobProfile", "PairPrediction", "PairTimes", "PairingPlan",
    "SimJob", "SimResult", "SweepResult", "colocated_steps_per_s", "crossover_round_s",
    "group_jobs", "hyperperiod_s", "load_profiles", "match_gains", "normalised_throughput",
    "place", "plan_pairs", "policy_steps_per_s", "predict_pair", "predict_pairs",
    "profile_from_train_stats", "profiles_from_comparison", "recommend", "run_cluster",
    "run_sweep", "save_heatmap", "simulate", "synthetic_profiles", "validate_comparison",
]
