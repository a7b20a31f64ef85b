"""Validation against a hand-made comparison JSON (the schema compare.py writes)."""

import json

import pytest

from crossover_tf_planner import validate
from crossover_tf_planner.compare_record import Comparison
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
    # cpu model, one step of each per round: max(device .125 + 2 hand-offs, links .125,
    # B's own step .15 + a hand-off) = .1502 s against solo steps of .1 and .15 s.
    assert report["device_model"] == "cpu"
    assert row["analytical"] == pytest.approx((0.1 + 0.15) / 0.1502)
    assert 1.3 < row["simulated"] < 1.6  # the gpu-like simulator: random phases cost overlap
    assert report["recommendation"] == {"predicted": "naive", "measured_winner": "cross"}
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
    with pytest.raises(ValueError, match="solo_A, solo_B"):
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


def test_comm_cpu_cost_comes_from_the_calibration_and_the_link():
    data = comparison({"sequential": 1.0, "naive": 1.6, "crossover": 1.6})
    data["regime"] = {"bandwidth_mbit": 80.0, "calibration": {"fit": {"per_mbit_s": 8.0}},
                      "comm_cpu": {"cpu_per_wait_s": 0.1, "cpu_s_per_mb": 0.002}}
    a, b = validate.profiles_from_comparison(data)
    # 8 Mbit = 1 MB on the wire per step: 0.1 * M + 0.002 * 1.
    assert a.comm_cpu_s == pytest.approx(0.1 * 0.05 + 0.002)
    assert b.comm_cpu_s == pytest.approx(0.1 * 0.075 + 0.002)
    del data["regime"]["calibration"]  # fixed link: M x bandwidth bounds the bytes
    a, _ = validate.profiles_from_comparison(data, {"cpu_per_wait_s": 0.0, "cpu_s_per_mb": 0.01})
    assert a.comm_cpu_s == pytest.approx(0.01 * 80 * 0.05 / 8)
    report = validate.validate_comparison(data, sim_steps=30)
    assert report["profiles"][0]["comm_cpu_s"] > 0


def test_three_jobs_are_checked_against_the_fifo_round():
    data = comparison({})
    solo = data["scenarios"]["solo_A"]["jobs"]["A"]
    data["scenarios"]["solo_C"] = scenario({"C": {**solo, "job": "C"}})
    jobs = {"A": solo, "B": {**solo, "job": "B"}, "C": {**solo, "job": "C"}}
    data["scenarios"]["solo_B"] = scenario({"B": jobs["B"]})
    for name, share in (("sequential", 1 / 3), ("naive", 2 / 3), ("crossover", 2 / 3)):
        data["scenarios"][name] = scenario({k: {**v, "images_per_s": v["images_per_s"] * share}
                                            for k, v in jobs.items()})
    report = validate.validate_comparison(data)
    # Three equal jobs, C = M = 50 ms: a FIFO round is 3 x 50 ms (+ hand-offs) for 3 x 100 ms
    # of solo steps, so both naive and crossover give 2 solo-job equivalents.
    row = report["normalised_ratios"]["crossover/sequential"]
    assert row["measured"] == pytest.approx(2.0)
    assert row["analytical"] == pytest.approx(0.3 / (0.15 + 3 * 2e-4))
    assert report["normalised_ratios"]["crossover/naive"]["analytical"] == pytest.approx(
        0.15 / 0.1506)
    assert report["recommendation"] == {"predicted": "naive", "measured_winner": "naive"}
    assert "simulated" not in row and "—" in validate.to_markdown(report)


def test_measured_winner_is_the_aggregate_rule_the_tables_show():
    """A fast job A and a slow job B: crossover gives A 0.8 of its solo rate and B 0.45,
    naive 0.6 each. In solo-job equivalents crossover gains 4% (naive by the 5% rule), in
    aggregate images/s 10% (cross). Every report names one winner: the aggregate one, which
    compare.md's and sweep.md's crossover/naive shows."""
    from experiments.comparison import trials
    data = comparison({})
    solo = {k: data["scenarios"][f"solo_{k}"]["jobs"][k] for k in "AB"}

    def pair(share_a, share_b):
        return scenario({"A": {**solo["A"], "images_per_s": solo["A"]["images_per_s"] * share_a},
                         "B": {**solo["B"], "images_per_s": solo["B"]["images_per_s"] * share_b}})

    data["scenarios"].update(sequential=pair(0.5, 0.5), naive=pair(0.6, 0.6),
                             crossover=pair(0.8, 0.45))
    report = validate.validate_comparison(data, sim_steps=30)
    assert report["normalised_ratios"]["crossover/naive"]["measured"] == pytest.approx(1.25 / 1.2)
    agg = {k: data["scenarios"][k]["aggregate_images_per_s"] for k in ("naive", "crossover")}
    assert agg["crossover"] / agg["naive"] > 1.09
    assert report["recommendation"]["measured_winner"] == "cross"
    seq = data["scenarios"]["sequential"]["aggregate_images_per_s"]
    ratios = {"naive_over_sequential": agg["naive"] / seq,
              "crossover_over_sequential": agg["crossover"] / seq,
              "crossover_over_naive": agg["crossover"] / agg["naive"]}
    record = Comparison.from_dict({"scenarios": {}, "ratios": ratios, "planner": report})
    assert trials.verdict(record)["measured_winner"] == "cross"
    del data["scenarios"]["sequential"]  # nothing to measure a winner against
    report = validate.validate_comparison(data, sim_steps=30)
    assert report["recommendation"]["measured_winner"] is None
    assert "measured winner: **— (no sequential run)**" in validate.to_markdown(report)


def test_crossing_with_link_turns_is_predicted_and_checked_where_it_ran():
    """Jobs at M/C 1 whose link moves 0.6 of itself when their allreduces overlap at random:
    naive co-location needs 0.125 / 0.6 s per round, link turns about B's own step (0.15 s).
    The planner recommends crossing with turns where the comparison ran it, and judges only
    plain crossing where it did not."""
    data = comparison({"sequential": 1.0, "naive": 1.3, "crossover": 1.35,
                       "crossover_turn": 1.7})
    data["regime"] = {"link_contention": {"shared_efficiency": 0.6, "compute_slowdown": 1.0}}
    report = validate.validate_comparison(data, sim_steps=30)
    row = report["normalised_ratios"]["crossover_turn/naive"]
    assert row["measured"] == pytest.approx(1.7 / 1.3)
    assert row["analytical"] == pytest.approx((0.125 / 0.6) / 0.1502, rel=1e-3)
    assert "simulated" not in row  # the gpu-like simulator has no link turns
    assert report["recommendation"] == {"predicted": "cross", "measured_winner": "cross"}
    assert report["prediction"]["policy"] == "crossover_turn"
    assert report["link_contention"]["shared_efficiency"] == 0.6
    assert "| normalised | crossover_turn/naive | 1.308 |" in validate.to_markdown(report)
    del data["scenarios"]["crossover_turn"]
    report = validate.validate_comparison(data, sim_steps=30)
    assert report["recommendation"]["predicted"] == "naive"  # plain crossing shares the link
    assert "crossover_turn/naive" not in report["normalised_ratios"]
