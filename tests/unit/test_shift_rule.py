"""CASSINI's static shift rule (crossover_tf_planner/shift_rule.py) on hand-made periods:
the shift it picks and the allreduce overlap it predicts, at T_B/T_A = 1, 1.5 and 2."""

import numpy as np
import pytest

from crossover_tf_planner import analytical, shift_rule
from crossover_tf_planner.profile import JobProfile
from crossover_tf_planner.shift_rule import StepPhases, choose_shift


@pytest.mark.parametrize("a, b, shift, overlap, random", [
    # Equal periods, C = M: B computes under A's allreduce, and the allreduces never meet.
    (StepPhases(0.5, 0.5), StepPhases(0.5, 0.5), 0.5, 0.0, 0.25),
    # Equal periods, C > M: many shifts keep them apart; the one at A's allreduce wins the tie.
    (StepPhases(0.6, 0.4), StepPhases(0.6, 0.4), 0.6, 0.0, 0.16),
    # Equal periods, M > C: the allreduces must meet; the least overlap, at A's allreduce.
    (StepPhases(0.4, 0.6), StepPhases(0.4, 0.6), 0.4, 0.2, 0.36),
])
def test_equal_periods_put_a_allreduce_under_b_compute(a, b, shift, overlap, random):
    plan = choose_shift(a, b)
    assert (plan.steps_a, plan.steps_b, plan.hyperperiod_s) == (1, 1, pytest.approx(1.0))
    assert plan.shift_s == pytest.approx(shift)
    assert plan.overlap_s == pytest.approx(overlap, abs=1e-9)
    assert plan.random_overlap_s == pytest.approx(random)


def test_period_ratio_one_and_a_half_aligns_three_steps_of_a_with_two_of_b():
    a = StepPhases(0.75, 0.25)  # T_A = 1
    # B's two allreduces fall half a period of A apart: a shift of 0.25 slips both into A's
    # compute (B's at 0.5-0.75 and 2.0-2.25 of the 3 s hyperperiod).
    fits = choose_shift(a, StepPhases(1.25, 0.25))
    assert (fits.steps_a, fits.steps_b, fits.hyperperiod_s) == (3, 2, pytest.approx(3.0))
    assert fits.shift_s == pytest.approx(0.25) and fits.overlap_s == pytest.approx(0.0)
    assert fits.random_overlap_s == pytest.approx(3 * 0.25 * 2 * 0.25 / 3)
    # C = M for both: B's allreduces cover opposite halves of A's period, so every shift
    # overlaps as much as a random one: the rule cannot help (the paper's common case).
    half = choose_shift(StepPhases(0.5, 0.5), StepPhases(0.75, 0.75))
    assert half.overlap_s == pytest.approx(half.random_overlap_s) == pytest.approx(0.75)


def test_period_ratio_two_fits_b_allreduce_into_a_compute():
    plan = choose_shift(StepPhases(0.5, 0.5), StepPhases(1.5, 0.5))  # T_B = 2 T_A
    assert (plan.steps_a, plan.steps_b, plan.hyperperiod_s) == (2, 1, pytest.approx(2.0))
    assert plan.shift_s == pytest.approx(0.5) and plan.overlap_s == pytest.approx(0.0)
    assert plan.random_overlap_s == pytest.approx(0.25) and plan.overlap_share == 0.0
    # C = M for B too: B's allreduce spans a whole period of A and meets half of its comm.
    even = choose_shift(StepPhases(0.5, 0.5), StepPhases(1.0, 1.0))
    assert even.overlap_s == pytest.approx(0.5) == pytest.approx(even.random_overlap_s)


def test_measured_periods_are_aligned_on_a_small_lcm():
    assert shift_rule.lcm_alignment(1.0, 1.52) == (3, 2)
    assert shift_rule.lcm_alignment(0.9, 1.83) == (2, 1)
    assert shift_rule.lcm_alignment(1.0, 1.04) == (1, 1)
    assert shift_rule.lcm_alignment(1.0, 1.34) == (4, 3)


def test_overlap_is_counted_across_the_circle_edge():
    a = StepPhases(0.5, 0.5)
    shifts = np.array([0.0, 0.25, 0.5, 0.75])
    overlap = shift_rule.comm_overlap_s(a, a, shifts)
    assert overlap == pytest.approx([0.5, 0.25, 0.0, 0.25])


def test_bad_phases_and_periods_are_refused():
    with pytest.raises(ValueError, match="step phases"):
        StepPhases(-0.1, 0.5)
    with pytest.raises(ValueError, match="step phases"):
        StepPhases(0.0, 0.0)
    with pytest.raises(ValueError, match="periods must be positive"):
        shift_rule.lcm_alignment(0.0, 1.0)


def test_the_planner_predicts_the_shift_the_rule_picks():
    a = JobProfile(name="A", compute_s=0.05, comm_s=0.05)
    b = JobProfile(name="B", compute_s=0.15, comm_s=0.05)
    prediction = analytical.predict_pair(a, b)
    rule = choose_shift(StepPhases(a.device_s, a.comm_s, a.other_s),
                        StepPhases(b.device_s, b.comm_s, b.other_s))
    assert prediction.shift_offset_s == pytest.approx(rule.shift_s) == pytest.approx(0.05)
    assert prediction.normalised["shift"] > prediction.normalised["naive"]
