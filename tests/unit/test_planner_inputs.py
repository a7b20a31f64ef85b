"""The planner takes what jobs write: profile files and train.py's stats.json, told apart by
their fields; a bad file is one line naming it and exit status 2 (plan.py and crossover-plan)."""

import json
import subprocess
import sys

import pytest

from crossover_tf_planner.job_stats import JobStats
from crossover_tf_planner.json_io import InputFileError
from crossover_tf_planner.profile import JobProfile, load_profile, load_profiles


def write_stats(path, job, compute_s=0.05, comm_s=0.04):
    JobStats(job=job, global_batch_size=64, steps=20, timed_steps=15, step_time_s=0.1,
             images_per_s=640.0, timed_wall_s=1.5, compute_s=compute_s, comm_s=comm_s,
             apply_s=0.002, cpu_s=0.06).to_json(path)
    return str(path)


def write_profile(path, name, compute_s=0.05, comm_s=0.05):
    JobProfile(name=name, compute_s=compute_s, comm_s=comm_s).to_json(path)
    return str(path)


def test_each_kind_is_detected(tmp_path):
    from_stats = load_profile(write_stats(tmp_path / "stats.json", "A"))
    assert (from_stats.name, from_stats.source, from_stats.images_per_step) == ("A", "measured",
                                                                                64)
    assert from_stats.period_s == pytest.approx(0.1) and from_stats.cpu_s == 0.06
    from_profile = load_profile(write_profile(tmp_path / "b.json", "B"))
    assert from_profile == JobProfile(name="B", compute_s=0.05, comm_s=0.05)
    assert [p.name for p in load_profiles([tmp_path / "stats.json", tmp_path / "b.json"])] == [
        "A", "B"]


@pytest.mark.parametrize("content,reason", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "neither a job profile"),
    ('{"name": "A", "compute_s": 0.05}', "missing required field"),
    ('{"job": "A", "global_batch_size": 8, "steps": 5, "timed_steps": 4, "step_time_s": 0.1, '
     '"images_per_s": 80, "timed_wall_s": 0.4}', "lack compute_s, comm_s"),
    ('{"name": "A", "compute_s": "fast", "comm_s": 0.1}', "compute_s must be a number"),
])
def test_a_broken_file_is_named_with_what_is_wrong(tmp_path, content, reason):
    path = tmp_path / "broken.json"
    path.write_text(content)
    with pytest.raises(InputFileError, match=reason) as error:
        load_profile(str(path))
    assert str(error.value).startswith(f"{path}: ") and "\n" not in str(error.value)
    with pytest.raises(InputFileError, match="no-such.json: No such file"):
        load_profile(str(tmp_path / "no-such.json"))


def test_plan_py_reads_stats_and_fails_in_one_line(tmp_path, child_env):
    """The README's path: --mode=recommend on two jobs' stats.json; a broken one exits 2."""
    a = write_stats(tmp_path / "a.json", "A")
    b = write_stats(tmp_path / "b.json", "B", compute_s=0.03, comm_s=0.06)
    command = [sys.executable, "-m", "experiments.plan", "--mode=recommend",
               f"--out_dir={tmp_path / 'plan'}"]
    ok = subprocess.run([*command, f"--profiles={a},{b}"], env=child_env, capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert " for A + B: " in ok.stdout
    assert json.loads((tmp_path / "plan" / "recommend.json").read_text())["job_b"] == "B"
    (tmp_path / "bad.json").write_text('{"job": "C"}')
    bad = subprocess.run([*command, f"--profiles={a},{tmp_path / 'bad.json'}"], env=child_env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"plan: error: {tmp_path / 'bad.json'}: job stats 'C' is missing required field(s): "
        "global_batch_size, steps, timed_steps, step_time_s, images_per_s, timed_wall_s"]
