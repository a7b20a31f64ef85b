"""experiments/plan.py: every mode writes its JSON and markdown; bad use is refused."""

import json

import pytest
from absl import flags

from crossover_tf_planner.profile import JobProfile
from experiments import plan


@pytest.fixture(scope="module")
def flag_values():
    plan.define_flags()
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    return flags.FLAGS


def profile_files(tmp_path, shapes):
    paths = []
    for name, (compute, comm) in shapes.items():
        paths.append(str(tmp_path / f"{name}.json"))
        JobProfile(name=name, compute_s=compute, comm_s=comm).to_json(paths[-1])
    return paths


def test_recommend_and_pair(flag_values, tmp_path):
    paths = profile_files(tmp_path, {"A": (0.05, 0.05), "B": (0.05, 0.05), "C": (0.05, 0.0)})
    out = plan.run(flag_values, {"mode": "recommend", "profiles": paths[:2],
                                 "out_dir": str(tmp_path)})
    assert out["result"]["recommendation"] == "cross"
    assert json.loads(open(out["paths"]["json"]).read())["job_a"] == "A"
    out = plan.run(flag_values, {"mode": "pair", "profiles": paths, "out_dir": str(tmp_path)})
    assert out["result"]["unpaired"] == ["C"]


def test_sweep_and_simulate_write_outputs(flag_values, tmp_path):
    out = plan.run(flag_values, {"mode": "sweep", "cm_ratios": ["1"],
                                 "period_ratios": ["1", "1.5"], "out_dir": str(tmp_path)})
    assert (tmp_path / "sweep.png").exists() and out["result"]["headline"]["pairs"] == 2
    out = plan.run(flag_values, {"mode": "simulate", "n_hosts": 8, "n_jobs": 4,
                                 "sim_steps": 20, "out_dir": str(tmp_path)})
    assert out["result"]["groups"] == 2 and "crossover" in out["markdown"]


def test_bad_use_is_refused(flag_values, tmp_path):
    with pytest.raises(ValueError, match="at least 2"):
        plan.run(flag_values, {"mode": "recommend", "profiles": [], "out_dir": str(tmp_path)})
    with pytest.raises(ValueError, match="comparison"):
        plan.run(flag_values, {"mode": "validate", "out_dir": str(tmp_path)})
    with pytest.raises(ValueError, match=r"unknown setting\(s\)"):
        plan.run(flag_values, {"colour": "blue"})


def test_recommend_charges_a_measured_link_contention(flag_values, tmp_path):
    """Two jobs at M/C 1.5 on the cpu model: a lossless link leaves nothing to win over naive
    co-location; the contention a probe measured on the jobs' cluster makes crossing with
    link turns the recommendation (and pairing pairs them)."""
    paths = profile_files(tmp_path, {"A": (0.4, 0.6), "B": (0.4, 0.6)})
    base = {"profiles": paths, "device_model": "cpu", "out_dir": str(tmp_path)}
    out = plan.run(flag_values, {**base, "mode": "recommend"})
    assert out["result"]["recommendation"] == "naive"
    contention = tmp_path / "contention.json"
    contention.write_text(json.dumps({"shared_efficiency": 0.8, "compute_slowdown": 1.0}))
    out = plan.run(flag_values, {**base, "mode": "recommend",
                                 "link_contention": str(contention)})
    assert (out["result"]["recommendation"], out["result"]["policy"]) == (
        "cross", "crossover_turn")
    assert out["markdown"].startswith("**cross** (with link turns) for A + B")
    out = plan.run(flag_values, {**base, "mode": "pair", "link_contention": str(contention)})
    assert out["result"]["unpaired"] == [] and out["result"]["total_gain"] == pytest.approx(
        2 / 1.2 - 1)
