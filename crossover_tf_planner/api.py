"""The planner's stable entry points for a scheduler: recommend for two jobs, pair for N.

A scheduler holds what its jobs wrote (profile files from crossover_tf.ProfileCallback,
train.py's stats.json) or records it built itself, so both functions take any of those, and
return typed results with ``to_json``. The keyword arguments and the result fields are a
contract (tests/unit/test_planner_api.py pins them); the modules behind them may change.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence, Union

from crossover_tf_planner import pairing
from crossover_tf_planner.analytical import PairPrediction, predict_pair
from crossover_tf_planner.comm_cost import NO_CONTENTION, LinkContention
from crossover_tf_planner.job_stats import JobStats
from crossover_tf_planner.pairing import PairingPlan
from crossover_tf_planner.profile import (JobProfile, load_profile, profile_from_record,
                                          profile_from_train_stats)

# A job as a caller may hold it: its profile, its stats, a parsed JSON object of either, or
# the path of a file holding one.
JobInput = Union[JobProfile, JobStats, Mapping[str, Any], str, os.PathLike]


def as_profile(job: JobInput) -> JobProfile:
    """The profile of a job given in any form ``JobInput`` allows."""
    if isinstance(job, JobProfile):
        return job
    if isinstance(job, JobStats):
        return profile_from_train_stats(job)
    if isinstance(job, Mapping):
        return profile_from_record(dict(job))
    return load_profile(job)


def recommend(a: JobInput, b: JobInput, *, min_gain: float = 0.05, device_model: str = "gpu",
              device_efficiency: float | None = None,
              contention: LinkContention | None = None) -> PairPrediction:
    """Whether jobs ``a`` and ``b`` should share devices, and how: the result's
    ``recommendation`` is "do not pair", "naive", "cross" or "shift" (``policy`` says which
    crossing), with each policy's predicted throughput. ``device_model`` is "gpu" (time-sliced
    contexts) or "cpu" (one time-sliced core per host); ``contention`` is the link's measured
    contention (None: a lossless link)."""
    return predict_pair(as_profile(a), as_profile(b), min_gain=min_gain, model=device_model,
                        device_efficiency=device_efficiency,
                        contention=contention or NO_CONTENTION)


def pair(jobs: Sequence[JobInput], *, min_gain: float = 0.05, device_model: str = "gpu",
         device_efficiency: float | None = None,
         contention: LinkContention | None = None) -> PairingPlan:
    """Which of ``jobs`` to pair (maximum-weight matching of the predicted gains; the others
    run alone), with the same options as ``recommend``."""
    return pairing.plan_pairs([as_profile(job) for job in jobs], min_gain=min_gain,
                              model=device_model, device_efficiency=device_efficiency,
                              contention=contention or NO_CONTENTION)
