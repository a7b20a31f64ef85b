"""crossover_tf.ProfileCallback: a 2-rank job writes its profile, and the planner reads it."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import WORKERS, horovodrun_command, run_bounded
from crossover_tf_planner import JobProfile, load_profile, recommend

WORKER = str(WORKERS / "profile_worker.py")


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_rank_job_writes_a_profile_the_planner_takes(tmp_path, lease_group, child_env):
    path = tmp_path / "myjob.json"
    result = run_bounded(horovodrun_command(2, sys.executable, WORKER, str(path),
                                            str(tmp_path / "result.json"), "--group",
                                            lease_group), child_env, timeout=240)
    assert result.returncode == 0, result.stdout[-6000:]
    seen = json.loads((tmp_path / "result.json").read_text())
    assert seen["steps_ran"] == 2 + 6  # stop_training ends fit once the profile is written
    assert "needs a crossover group" in seen["no_group_error"]
    profile = load_profile(path)
    assert profile == JobProfile.from_dict(seen["profiles"][0])  # rank 0 wrote its own
    assert (profile.name, profile.source, profile.images_per_step) == ("myjob", "measured", 32)
    assert profile.compute_s > 0 and profile.comm_s > 0 and profile.apply_s > 0
    assert profile.cpu_s > 0

    other = JobProfile(name="other", compute_s=profile.comm_s, comm_s=profile.compute_s)
    other.to_json(tmp_path / "other.json")
    assert recommend(path, other).job_a == "myjob"
    cli = subprocess.run([sys.executable, "-m", "crossover_tf_planner", "recommend", str(path),
                          str(tmp_path / "other.json"), "--json", str(tmp_path / "rec.json")],
                         env=child_env, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert " for myjob + other: " in cli.stdout
    assert json.loads((tmp_path / "rec.json").read_text())["job_b"] == "other"
