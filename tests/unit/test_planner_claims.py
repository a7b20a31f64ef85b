"""What compare.md and crossover-plan claim of the planner: its error on every trial with the
spread, judged by the measured intervals, and the cpu model's stated limitation."""
from __future__ import annotations

import pytest

from crossover_tf_planner import api, device_models, validate
from crossover_tf_planner.compare_record import Comparison, Interval, Trial
from crossover_tf_planner.profile import JobProfile
from experiments.analysis import planner_errors, report


def _planner(measured: float) -> dict:
    """A trial's planner report of crossover/naive: the cpu model's 1.0, the simulator's 1.2."""
    return {"device_model": "cpu", "aggregate_images_ratios": {
        "crossover/naive": {"measured": measured, "analytical": 1.0, "simulated": 1.2}}}


def _comparison(measured: list[float], low: float = 1.012, high: float = 1.081) -> Comparison:
    per_trial = [Trial({}, {"crossover_over_naive": m}, planner=_planner(m)) for m in measured]
    return Comparison({}, {"crossover_over_naive": measured[0]}, trials=len(measured),
                      per_trial=per_trial, planner=per_trial[0].planner, ratio_interval={
                          "crossover_over_naive": Interval(low, high, 0.95, 3, 2000, "x")})


def test_errors_are_per_trial_with_their_spread():
    result = _comparison([1.05, 1.02, 1.10])
    spread = planner_errors.errors(result, "analytical")["crossover/naive"]
    assert spread.values == pytest.approx([1 / 1.05 - 1, 1 / 1.02 - 1, 1 / 1.10 - 1])
    assert (spread.median, spread.min, spread.max) == pytest.approx(
        (1 / 1.05 - 1, 1 / 1.10 - 1, 1 / 1.02 - 1))
    assert planner_errors.predictions(result, "simulated") == {"crossover/naive": 1.2}


def test_planner_block_shows_every_trials_error_and_claims_only_what_the_interval_holds():
    lines = planner_errors.markdown(_comparison([1.05, 1.02, 1.10]), "cpu")
    text = "\n".join(lines)
    assert "The planner's error on each of 3 trial(s), predicted / measured - 1" in text
    assert ("| crossover/naive | -4.8% [-9.1% to -2.0%]; 1.000 outside | "
            "+14.3% [+9.1% to +17.6%]; 1.200 outside | 1.012–1.081 |") in lines
    assert lines[-1] == ("Predictions inside the measured 95% interval: the cpu model 0 of 1; "
                         "the gpu-like simulator 0 of 1. Only those are borne out by this "
                         "comparison.")
    wide = "\n".join(planner_errors.markdown(_comparison([1.05, 1.02, 1.10], 0.98, 1.25), "cpu"))
    assert "1.000 inside" in wide and "1.200 inside" in wide
    assert "the cpu model 1 of 1; the gpu-like simulator 1 of 1" in wide
    assert planner_errors.markdown(Comparison({}), "cpu") == []


def test_one_trial_shows_its_error_without_a_spread():
    result = _comparison([1.05])
    assert "| crossover/naive | -4.8%; 1.000 outside |" in "\n".join(
        planner_errors.markdown(result, "cpu"))
    assert planner_errors.borne_out(1.0, None) == "—"


def _pair(model: str) -> str:
    a, b = (JobProfile(name, compute_s=0.1, comm_s=0.1) for name in "AB")
    return api.recommend(a, b, device_model=model).to_markdown()


def test_the_cpu_models_limitation_is_printed_wherever_its_predictions_are():
    """The cpu model's crossover round is never shorter than its naive round: said beside its
    predictions in compare.md's planner block and in crossover-plan's recommend and pair
    output; the gpu model has no such statement."""
    statement = device_models.CPU_LIMITATION
    assert statement.startswith("Limitation of the cpu model: it cannot predict plain "
                                "crossover above naive.")
    assert statement in _pair("cpu") and statement not in _pair("gpu")
    profiles = [JobProfile(name, compute_s=0.1, comm_s=0.1) for name in "ABC"]
    assert statement in api.pair(profiles, device_model="cpu").to_markdown()
    assert statement in validate.to_markdown(
        {"device_model": "cpu", "normalised_ratios": {}, "aggregate_images_ratios": {}})
    assert statement not in validate.to_markdown(
        {"device_model": "gpu", "normalised_ratios": {}, "aggregate_images_ratios": {}})
    assert statement in report.markdown(Comparison.from_json(
        "tests/data/compare_v1/compare.json"))


def test_the_cpu_model_never_predicts_crossover_above_naive():
    """The limitation stated, as the model computes it: over M/C from compute-bound to
    link-bound, with comm CPU and link contention, crossover / naive stays at or below 1."""
    from crossover_tf_planner.comm_cost import LinkContention
    for comm_s in (0.02, 0.05, 0.1, 0.2, 0.4):
        a, b = (JobProfile(name, compute_s=0.1, comm_s=comm_s, comm_cpu_s=0.01)
                for name in "AB")
        normalised = api.recommend(a, b, device_model="cpu",
                                   contention=LinkContention(0.85, 1.05)).normalised
        assert normalised["crossover"] <= normalised["naive"] + 1e-9, comm_s
