"""Pairing N jobs: maximum-weight matching, not greedy."""

import pytest

from crossover_tf_planner.pairing import match_gains, plan_pairs
from crossover_tf_planner.profile import JobProfile


def test_matching_beats_greedy_on_a_path():
    # Greedy takes the heaviest edge b-c (4) and is stuck at 4; the optimum is 3 + 3.
    gains = {("a", "b"): 3.0, ("b", "c"): 4.0, ("c", "d"): 3.0}
    assert match_gains(gains) == [("a", "b"), ("c", "d")]


def test_non_positive_gains_are_never_matched():
    assert match_gains({("a", "b"): 0.0, ("c", "d"): -1.0, ("a", "c"): 0.5}) == [("a", "c")]
    with pytest.raises(ValueError, match="itself"):
        match_gains({("a", "a"): 1.0})


def test_plan_pairs_complementary_jobs_and_leaves_compute_only_jobs_alone():
    jobs = [JobProfile(name="cm1", compute_s=0.05, comm_s=0.05),
            JobProfile(name="solo1", compute_s=0.05, comm_s=0.0),
            JobProfile(name="cm2", compute_s=0.05, comm_s=0.05),
            JobProfile(name="solo2", compute_s=0.08, comm_s=0.0)]
    plan = plan_pairs(jobs)
    assert [(p.job_a, p.job_b) for p in plan.pairs] == [("cm1", "cm2")]
    assert plan.pairs[0].recommendation == "cross"
    assert sorted(plan.unpaired) == ["solo1", "solo2"]
    assert plan.total_gain == pytest.approx(1.0, rel=1e-3)
    assert "cm1 | cm2 | cross" in plan.to_markdown()


def test_plan_pairs_bad_inputs():
    with pytest.raises(ValueError, match="empty"):
        plan_pairs([])
    same = JobProfile(name="x", compute_s=0.05, comm_s=0.05)
    with pytest.raises(ValueError, match="unique"):
        plan_pairs([same, same])
    assert plan_pairs([same]).unpaired == ["x"]
