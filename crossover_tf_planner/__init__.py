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

from crossover_tf_planner.analytical import PairPrediction
from crossover_tf_planner.api import JobInput, pair, recommend
from crossover_tf_planner.comm_cost import LinkContention, load_link_contention
from crossover_tf_planner.job_stats import JobStats
from crossover_tf_planner.json_io import InputFileError
from crossover_tf_planner.pairing import PairingPlan
from crossover_tf_planner.profile import JobProfile, load_profile

# The stable API: recommend and pair, what they take and what they return. Everything else is
# in its own module (crossover_tf_planner.analytical, .simulator, ...), where it may change
# between versions.
__all__ = [
    "InputFileError", "JobInput", "JobProfile", "JobStats", "LinkContention", "PairPrediction",
    "PairingPlan", "load_link_contention", "load_profile", "pair", "recommend",
]
