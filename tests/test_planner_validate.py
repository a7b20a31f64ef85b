"""Validation against a hand-made comparison JSON (the schema compare.py writes)."""

import json

import pytest

from crossover_tf_planner import validate
from crossover_tf_planner.job_stats import JobStats


def job(images_per_s, step, compute, comm):
    """A job's stats record; device time is split into compute and a 10% apply."""
    return JobStats(job="J", global_batch_size=64, steps=20, timed_steps=10, step_time_s=step,
                    images_per_s=images_per_s, timed_wall_s=10 * step, compute_s=0.9 * compute,
                    apply_s=0.1 * compute, comm_s=comm).to_dict()


def scenario(jobs):
    return {"jobs": jobs, "aggregate_images_per_s": sum(j["images_per_s"] for j in jobs.values())}


def comparison(normalised_by_scenario):
    """Job A: 64 images per 0.1 s step; job B: 64 per 0.15 s; each pair scenario
    runs both jobs at the given fraction of their solo speed."""
    solo = {"A": job(640.0, 0.1, 0.05, 0.05), "B": job(64 / 0.15, 0.15, 0.075, 0.075)}
    scenarios = {"solo_A": scenario({"A": solo["A"]}), "solo_B": scenario({"B": solo["B"]})}
    for name, normalised in normalised_by_scenario.items():
        share = normalised / 2
        scenarios[name] = scenario({k: {**v, "images_per_s": v["images_per_s"] * share}
                                    for k, v in solo.items()})
    return {"settings": {"handoff_s": 2e-4}, "scenarios": scenarios}


def test_ratios_and_errors_from_a_hand_made_comparison(tmp_path):
    path = tmp_path / "compare.json"
    path.write_text(json.dumps(comparison({"sequential": 1.0, "naive": 1.3, "crossover": 1.5})))
    report = validate.validate_comparison(str(path), sim_steps=60)
    a, b = report["profiles"]
    assert a["images_per_step"] == pytest.approx(64) and b["comm_s"] == 0.075
    assert a["compute_s"] + a["apply_s"] == pytest.approx(0.05) and a["other_s"] == 0.0
    row = report["normalised_ratios"]["crossover/sequential"]
    assert row["measured"] == pytest.approx(1.5)
    predicted = report["prediction"]["normalised"]
    assert row["analytical"] == pytest.approx(predicted["crossover"] / predicted["sequential"])
    assert row["analytical_error_pct"] == pytest.approx(100 * (row["analytical"] - 1.5) / 1.5)
    assert 1.3 < row["analytical"] < 1.6 and 1.3 < row["simulated"] < 1.6
    assert report["normalised_ratios"]["crossover/naive"]["measured"] == pytest.approx(1.5 / 1.3)
    assert report["aggregate_images_ratios"]["crossover/sequential"]["measured"] == \
        pytest.approx(1.5)
    assert "crossover/naive" in validate.to_markdown(report)


def test_missing_scenarios_are_skipped_or_rejected():
    report = validate.validate_comparison(comparison({"sequential": 1.0, "crossover": 1.5}),
                                          sim_steps=30)
    assert set(report["normalised_ratios"]) == {"crossover/sequential"}
    data = comparison({"crossover": 1.5})
    del data["scenarios"]["solo_B"]
    with pytest.raises(ValueError, match="solo_B"):
        validate.validate_comparison(data)
    data = comparison({})
    del data["scenarios"]["solo_A"]["jobs"]["A"]["comm_s"]
    with pytest.raises(ValueError, match="comm_s"):
        validate.validate_comparison(data)


def test_sequential_pair_counts_each_job_for_half_the_time():
    """compare.py's sequential scenario lists each job at its solo rate but credits it only
    with its share of the aggregate (per_job_in_aggregate): normalised throughput 1, not 2."""
    data = comparison({"crossover": 1.5})
    solo = {k: data["scenarios"][f"solo_{k}"]["jobs"][k] for k in "AB"}
    halves = {k: v["images_per_s"] / 2 for k, v in solo.items()}
    data["scenarios"]["sequential"] = {"jobs": solo, "per_job_in_aggregate": halves,
                                       "aggregate_images_per_s": sum(halves.values())}
    report = validate.validate_comparison(data, sim_steps=30)
    assert report["normalised_ratios"]["crossover/sequential"]["measured"] == pytest.approx(1.5)
