"""Jobs of unequal periods: job B's batch calibrated so that T_B/T_A is the asked-for ratio
within ±10% (comparison/period_fit.py, period_calibrate.py), held across trials, and the
regime table showing both ratios per trial (fake cluster and jobs)."""
from __future__ import annotations

import json
import math

import pytest

from experiments import compare
from experiments.comparison import period_fit, scenarios
from experiments.comparison.period_fit import PeriodPoint, StepFit
from compare_fakes import COMPUTE_S, LINK, job_stats, scenario_stats

pytestmark = pytest.mark.usefixtures("compare_flags")
BATCH_A = 128  # the comparison's default global batch


# -- the rule -------------------------------------------------------------------------------------
def test_fit_recovers_the_step_line_and_picks_the_batch_for_the_ratio():
    line = StepFit(fixed_s=0.12, per_image_s=0.1 / BATCH_A)
    fit = period_fit.fit_step([PeriodPoint(b, line.step_s(b)) for b in (128, 256, 384)])
    assert fit.fixed_s == pytest.approx(0.12) and fit.per_image_s == pytest.approx(0.1 / 128)
    # T_A = 0.22 s: ratio 2 needs 0.44 s, i.e. 409.6 images, rounded to the hosts' multiple.
    assert period_fit.batch_for(fit, 0.44, 2) == 410
    assert period_fit.batch_for(fit, 0.44, 8) == 408
    assert period_fit.batch_for(fit, 0.22, 2) == 128


def test_unreachable_periods_and_flat_steps_are_clear_errors():
    with pytest.raises(ValueError, match="cannot step as fast as 100 ms"):
        period_fit.batch_for(StepFit(0.12, 0.001), 0.1, 2)
    with pytest.raises(ValueError, match="barely grows with its batch"):
        period_fit.batch_for(StepFit(0.01, 1e-6), 0.5, 2, largest=1024)
    with pytest.raises(ValueError, match="did not grow with its batch"):
        period_fit.fit_step([PeriodPoint(128, 0.3), PeriodPoint(256, 0.29)])
    with pytest.raises(ValueError, match="distinct batches"):
        period_fit.fit_step([PeriodPoint(128, 0.3)])


def test_the_second_batch_stays_apart_and_a_drift_rebatches():
    first = PeriodPoint(256, 0.32)
    assert period_fit.second_batch(first, 0.44, 2) == 384  # 352 is too near: 1.5x away
    assert period_fit.second_batch(first, 0.80, 2) == 640  # the guess through the origin
    # B's compute grew by 30% while the fixed part stayed: fewer images bring it back.
    fit = StepFit(0.12, 0.1 / 128)
    drifted = 0.12 + 1.3 * 0.1 / 128 * 384
    assert period_fit.rebatched(fit, 384, drifted, 0.44, 2) == 316
    assert period_fit.in_tolerance(2.19, 2) and not period_fit.in_tolerance(2.21, 2)
    assert period_fit.steps_for(40, 10, 2.0) == 25 and period_fit.steps_for(40, 10, 1.0) == 40


def test_job_b_runs_its_own_model_batch_and_steps():
    c = type("Settings", (), {"model": "mlp", "global_batch_size": 128, "steps": 40,
                              "warmup_steps": 10, "job_b_model": "small_cnn",
                              "job_b_global_batch_size": 384, "period_ratio": 2.0})()
    assert scenarios.job_shape(c, "A") == {"model": "mlp", "global_batch_size": 128,
                                           "steps": 40}
    assert scenarios.job_shape(c, "B") == {"model": "small_cnn", "global_batch_size": 384,
                                           "steps": 25}
    assert scenarios.job_shape(c, "B", steps=30)["steps"] == 30  # a calibration run's


# -- in the comparison ----------------------------------------------------------------------------
DRIFT = {}  # trial -> factor on job B's compute (a machine that slows job B)


@pytest.fixture
def shaped_runs(fake_runs, monkeypatch):
    """The fake jobs, job B's steps growing with its batch as a real job's do."""
    fake = scenarios.run_scenario

    def run_scenario(cluster, c, name, out, run_name="", jobs=("A", "B"), steps=None,
                     start_shifts=None):
        stats = fake(cluster, c, name, out, run_name, jobs, steps, start_shifts)
        batch = c.job_b_global_batch_size
        if "B" in stats and batch:
            trial = int(run_name[1:].split("_")[0]) if run_name.startswith("t") else 0
            a = stats["A"] if "A" in stats else scenario_stats(
                COMPUTE_S, LINK.comm_s(cluster.bandwidth_mbit), 1.4)[name]["A"]
            compute = COMPUTE_S * batch / BATCH_A * DRIFT.get(trial, 1.0)
            solo_a = 1.1 * a.compute_s + a.comm_s
            period = a.step_time_s * (1.1 * compute + a.comm_s) / solo_a
            # Both leave warm-up together (the timed-start barrier) and run about as long.
            warmup, steps = c.warmup_steps, 60
            if "A" in stats:
                stats["A"] = job_stats("A", a.step_time_s, a.compute_s, a.comm_s, steps=steps)
            stats["B"] = job_stats(
                "B", period, compute, a.comm_s, start_s=warmup * (a.step_time_s - period),
                steps=warmup + math.ceil((steps - warmup) * a.step_time_s / period),
                batch=batch)
        return stats

    DRIFT.clear()
    monkeypatch.setattr(scenarios, "run_scenario", run_scenario)
    return fake_runs


def test_period_ratio_is_calibrated_and_held_and_tabulated(shaped_runs, tmp_path):
    DRIFT.update({1: 1.3, 2: 1.3})  # from trial 1 on job B computes 30% slower
    result = compare.run(overrides={"period_ratio": 2.0, "trials": 3, "bandwidth_mbit": 50.0,
                                    "comm_cpu_probe": False, "out_dir": str(tmp_path)})
    # A alone (T_A = 0.22 s), then B at 256 (T_B/T_A 1.45) and at 384 (1.91, within 10%).
    assert shaped_runs[:3] == ["A", "B_256", "B_384"]
    saved = json.loads((tmp_path / "compare.json").read_text())
    regime = saved["regime"]
    assert regime["period_ratio_asked"] == 2.0
    assert regime["period_calibration"]["batch"] == 384
    assert [p["batch"] for p in regime["period_calibration"]["points"]] == [256, 384]
    batches = [t["settings"]["job_b_global_batch_size"] for t in saved["per_trial"]]
    assert batches == [384, 384, 316]  # re-picked after trial 1 drifted, and back in it
    assert saved["per_trial"][1]["ratios"] == {}  # out of the regime: left out of the calls
    assert saved["per_trial"][2]["ratios"]
    assert "T_B/T_A 2.32" in saved["invalid"]["out of the regime"][0]["reason"]
    assert "crossover_over_naive" in result.ratios
    markdown = (tmp_path / "compare.md").read_text()
    assert "| M/C | no M/C asked | T_B/T_A | within ±10% of 2 |" in markdown
    assert "| 1.91 | yes |" in markdown and "| 2.32 | **no** |" in markdown
    assert "| 2.00 | yes |" in markdown


@pytest.mark.parametrize("overrides, message", [
    ({"period_ratio": -1.0}, "period_ratio must be 0"),
    ({"period_ratio": 9.0}, "period_ratio must be 0"),
    ({"period_ratio": 4.0}, "steps - warmup_steps >= 40"),
    ({"period_ratio": 2.0, "jobs": 3}, "--jobs=2"),
    ({"job_b_global_batch_size": 3}, "multiple of num_hosts"),
    ({"job_b_model": "resnet1000"}, "unknown model 'resnet1000'"),
])
def test_bad_period_settings_are_refused_up_front(overrides, message):
    with pytest.raises(ValueError, match=message):
        compare.run(overrides={"bandwidth_mbit": 50.0, **overrides})


def test_the_period_sweep_writes_one_table_with_the_up_front_calls(shaped_runs, tmp_path):
    """--sweep_period_ratio (scripts/run_shift.sh): one link, then per T_B/T_A job B shaped,
    the planner's call made from the period calibration's solo runs before the trials, and
    shift.md's table of every scenario over naive, measured and predicted."""
    result = compare.run(overrides={
        "sweep_period_ratio": ["1", "2"], "trials": 1, "bandwidth_mbit": 50.0,
        "scenarios": ["sequential", "naive", "shift", "crossover_turn"],
        "comm_cpu_probe": False, "out_dir": str(tmp_path)})
    # Ratio 1: A, then B at A's batch (in the regime at once); ratio 2 as above.
    assert shaped_runs[:2] == ["A", "B_128"] and shaped_runs[6:9] == ["A", "B_256", "B_384"]
    rows = json.loads((tmp_path / "shift.json").read_text())["rows"]
    assert [r["period_ratio_asked"] for r in rows] == [1.0, 2.0] == [
        r["period_ratio_asked"] for r in result["rows"]]
    for row in rows:
        assert set(row["scenarios"]) == {"shift", "crossover_turn"}
        for scenario in row["scenarios"].values():
            assert scenario["predicted_call"] in ("win", "no gain")
            assert scenario["call"] in ("win", "tie", "too close to call", "loss")
    saved = json.loads((tmp_path / "period_2" / "compare.json").read_text())
    before = saved["regime"]["period_calibration"]["prediction"]
    assert rows[1]["scenarios"]["shift"]["predicted"] == before["over_naive"]["shift"]
    assert rows[1]["recommended"] == before["recommendation"]
    table = (tmp_path / "shift.md").read_text()
    assert ("| 2 (1.91) | 1.20 | shift / naive | 1.042 [1.042–1.042] | win | 1.000 (no gain) "
            "| **no** |") in table  # the cpu model: a shift gains nothing on one core
    assert "- T_B/T_A 2: recommended before the trials **" in table


@pytest.mark.parametrize("overrides, message", [
    ({"sweep_period_ratio": ["1", "x"]}, "sweep_period_ratio must be numbers"),
    ({"sweep_period_ratio": ["1", "1"]}, "distinct"),
    ({"sweep_period_ratio": ["2"], "period_ratio": 2.0}, "drop --period_ratio"),
    ({"sweep_period_ratio": ["2"], "scenarios": ["sequential", "shift"]}, "run naive"),
    ({"sweep_period_ratio": ["1", "5"]}, "period_ratio must be 0"),
])
def test_bad_period_sweeps_are_refused_up_front(overrides, message):
    with pytest.raises(ValueError, match=message):
        compare.run(overrides={"bandwidth_mbit": 50.0, **overrides})
