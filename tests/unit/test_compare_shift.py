"""The shift scenario in the comparison (fake cluster and jobs): job B started at the rule's
shift from the latest solo runs, its ratios with intervals, compare.md's shift table, and
its settings refused up front."""
from __future__ import annotations

import json

import pytest

from crossover_tf_planner import registry
from experiments import compare
from experiments.comparison import scenarios, shift
from compare_fakes import COMPUTE_S, LINK, START_SHIFTS, scenario_stats

pytestmark = pytest.mark.usefixtures("compare_flags")
SCENARIOS = ["sequential", "naive", "shift", "crossover", "crossover_turn"]


def test_shift_runs_interleaved_at_the_rules_shift_and_gets_its_ratios(fake_runs, tmp_path):
    result = compare.run(overrides={"scenarios": SCENARIOS, "trials": 2, "bandwidth_mbit": 50.0,
                                    "comm_cpu_probe": False, "out_dir": str(tmp_path)})
    assert fake_runs == ["t0_sequential", "t0_naive", "t0_shift", "t0_crossover",
                         "t0_crossover_turn", "t1_naive", "t1_crossover", "t1_sequential",
                         "t1_crossover_turn", "t1_shift"]
    solos = scenario_stats(COMPUTE_S, LINK.comm_s(50.0), 1.4)["sequential"]
    expected, plan = shift.start_shifts(solos)
    assert expected["A"] == 0.0 and expected["B"] == plan.shift_s > 0
    assert START_SHIFTS == {"t0_shift": expected, "t1_shift": expected}
    saved = json.loads((tmp_path / "compare.json").read_text())
    for trial in saved["per_trial"]:
        assert trial["settings"]["shift"]["start_shifts_s"] == expected
        assert trial["settings"]["shift"]["overlap_s"] == pytest.approx(plan.overlap_s)
    assert result.ratios["shift_over_naive"] == pytest.approx(1.25 / 1.2)
    assert result.ratios["crossover_turn_over_shift"] > 0
    assert saved["ratio_interval"]["shift_over_naive"]
    markdown = (tmp_path / "compare.md").read_text()
    assert "| shift / naive | 1.042" in markdown
    assert "Shift scenario (CASSINI's rule" in markdown
    assert f"| 0 | A 0, B {1e3 * plan.shift_s:.0f} |" in markdown
    # The planner predicts it (the cpu model: a shift gains nothing over naive on one core).
    predicted = saved["planner"]["normalised_ratios"]["shift/naive"]
    assert predicted["measured"] == pytest.approx(1.25 / 1.2)
    assert predicted["analytical"] == pytest.approx(1.0)


def test_shift_takes_the_latest_solo_runs():
    first, second = ({"sequential": {"A": "a0"}}, {"naive": {}})
    assert shift.latest_solos([first, second]) == {"A": "a0"}
    with pytest.raises(ValueError, match="sequential scenario first"):
        shift.latest_solos([second])


def test_the_shift_scenario_needs_its_shifts_and_runs_without_a_lease():
    with pytest.raises(ValueError, match="start shifts go with the shift scenario"):
        scenarios.run_scenario(None, None, registry.SHIFT, None)
    assert registry.SHIFT in registry.NO_LEASE and registry.SHIFT not in registry.CROSSED


@pytest.mark.parametrize("overrides, message", [
    ({"scenarios": SCENARIOS, "jobs": 3}, "the shift scenario starts job B"),
    ({"scenarios": SCENARIOS, "warmup_steps": 0}, "the shift scenario starts job B"),
])
def test_shift_settings_are_checked(overrides, message):
    with pytest.raises(ValueError, match=message):
        compare.run(overrides={"bandwidth_mbit": 50.0, **overrides})


@pytest.mark.parametrize("overrides, message", [
    ({"start_shift_s": -1.0}, "start_shift_s"),
    ({"start_shift_s": 0.5}, "needs --start_barrier"),
    ({"start_shift_s": 0.5, "start_barrier": "/tmp/b:2", "warmup_steps": 0}, "warmup_steps"),
])
def test_train_refuses_a_shift_it_cannot_apply(overrides, message):
    from experiments import train
    with pytest.raises(ValueError, match=message):
        train.train_argv(overrides)
