"""The API a scheduler calls: crossover_tf_planner.recommend and pair, their results' JSON, and
the crossover-plan command line. The signatures and keys pinned here are a contract: change
them only with a note in the README's planner part."""

import importlib
import inspect
import json
import subprocess
import sys
import tomllib

import pytest

import crossover_tf_planner as planner
from crossover_tf_planner import cli, policies
from conftest import REPO_ROOT
from test_planner_inputs import write_profile, write_stats

OPTIONS = ["min_gain", "device_model", "device_efficiency", "contention"]
PREDICTION_KEYS = {"job_a", "job_b", "device_model", "normalised", "images_per_s",
                   "steps_per_s", "shift_offset_s", "hyperperiod_s", "recommendation",
                   "expected_gain", "gain_vs_naive", "reason", "policy"}
RECOMMENDATIONS = {"do not pair", "naive", "cross", "shift"}


def test_signatures_are_pinned():
    for function, positional in ((planner.recommend, ["a", "b"]), (planner.pair, ["jobs"])):
        parameters = inspect.signature(function).parameters
        assert list(parameters) == positional + OPTIONS
        assert [parameters[o].kind for o in OPTIONS] == [inspect.Parameter.KEYWORD_ONLY] * 4
        assert parameters["min_gain"].default == 0.05
        assert parameters["device_model"].default == "gpu"
        assert function.__name__ in planner.__all__ and function.__doc__


def test_recommend_takes_every_form_of_a_job_and_returns_json(tmp_path):
    stats_path = write_stats(tmp_path / "stats.json", "A")
    b = planner.JobProfile(name="B", compute_s=0.05, comm_s=0.05)
    forms = [stats_path, planner.JobStats.from_json(stats_path),
             json.loads(open(stats_path).read()), planner.load_profile(stats_path)]
    results = [planner.recommend(a, b) for a in forms]
    assert all(r == results[0] for r in results)
    result = results[0]
    assert isinstance(result, planner.PairPrediction)
    assert result.recommendation in RECOMMENDATIONS and (result.job_a, result.job_b) == ("A", "B")
    data = json.loads(result.to_json(tmp_path / "out.json"))
    assert set(data) == PREDICTION_KEYS and data == json.loads((tmp_path / "out.json").read_text())
    assert set(data["normalised"]) == set(policies.PREDICTED)
    contended = planner.recommend(stats_path, b, device_model="cpu",
                                  contention=planner.LinkContention(shared_efficiency=0.8))
    assert contended.device_model == "cpu"


def test_pair_returns_a_plan_with_json(tmp_path):
    jobs = [planner.JobProfile(name=n, compute_s=0.05, comm_s=c)
            for n, c in (("A", 0.05), ("B", 0.05), ("C", 0.0))]
    plan = planner.pair(jobs)
    assert isinstance(plan, planner.PairingPlan)
    data = json.loads(plan.to_json())
    assert set(data) == {"pairs", "unpaired", "total_gain", "candidates"}
    assert data["unpaired"] == ["C"] and set(data["pairs"][0]) == PREDICTION_KEYS
    with pytest.raises(ValueError, match="unique"):
        planner.pair([jobs[0], jobs[0]])


def test_command_line_prints_and_writes_json(tmp_path, child_env):
    a = write_stats(tmp_path / "a.json", "A")
    b = write_profile(tmp_path / "b.json", "B")
    out = tmp_path / "rec.json"
    result = subprocess.run([sys.executable, "-m", "crossover_tf_planner", "recommend", a, b,
                             "--json", str(out)], env=child_env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("**") and " for A + B: " in result.stdout
    assert json.loads(out.read_text())["job_a"] == "A"
    (tmp_path / "c.json").write_text("{}")
    assert cli.run(["pair", a, b, "--json", "-"]) == 0
    assert cli.run(["recommend", a, str(tmp_path / "c.json")]) == cli.EXIT_BAD_INPUT
    assert cli.run(["recommend", a, a]) == cli.EXIT_BAD_INPUT


def test_bad_file_is_one_line_and_status_2(tmp_path, capsys):
    (tmp_path / "c.json").write_text("{}")
    assert cli.run(["pair", str(tmp_path / "c.json")]) == 2
    assert capsys.readouterr().err == (f"crossover-plan: error: {tmp_path / 'c.json'}: neither "
                                       "a job profile (has 'name', 'compute_s', 'comm_s') nor "
                                       "job stats (has 'job', 'step_time_s', ...)\n")


def test_entry_point_is_declared_and_resolves():
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, function = scripts["crossover-plan"].split(":")
    assert module.startswith("crossover_tf_planner.")
    assert getattr(importlib.import_module(module), function) is cli.main


def test_jobs_of_very_different_steps_are_predicted_or_refused_in_one_line(tmp_path, capsys):
    """A profiled user job of 0.1 ms steps against a 0.2 s one once ended in a traceback
    ("fluid model saw too few steps per job"): the slower job must complete steps too."""
    fast = planner.JobProfile(name="fast", compute_s=1e-4, comm_s=1e-4)
    slow = planner.JobProfile(name="slow", compute_s=0.1, comm_s=0.1)
    assert planner.recommend(fast, slow).recommendation in RECOMMENDATIONS
    tiny = planner.JobProfile(name="tiny", compute_s=1e-6, comm_s=1e-6)
    paths = [str(tmp_path / f"{p.name}.json") for p in (tiny, slow)]
    for profile, path in zip((tiny, slow), paths):
        profile.to_json(path)
    assert cli.run(["recommend", *paths]) == cli.EXIT_BAD_INPUT
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "times the other's" in error
