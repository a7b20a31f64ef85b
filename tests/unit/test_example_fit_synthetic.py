"""crossover_tf.examples.fit_synthetic, the job every deploy/ recipe runs (issue 63 item 3): it
is installed with the package, takes the flags the recipes and `crossover-plan pair --slurm`
give it, and trains, run as `python -m` the way a container runs it."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from crossover_tf.examples import fit_synthetic


def test_flags_parse_as_the_planner_appends_them() -> None:
    args = fit_synthetic.parse_flags(["--job=A", "--group=xo0-A-B", "--group_jobs=2",
                                      "--join_timeout_s=600", "--link_turn=1",
                                      "--backend=tensorflow", "--steps=7", "--batch_size=32"])
    assert (args.group, args.group_jobs, args.link_turn, args.steps) == ("xo0-A-B", 2, 1, 7)
    assert {"group", "group_jobs", "join_timeout_s", "link_turn", "backend", "steps",
            "batch_size", "lease_dir", "job"} <= set(fit_synthetic.FLAG_NAMES)
    with pytest.raises(SystemExit):
        fit_synthetic.parse_flags(["--steps=0"])
    # No --group: the strategy reads $CROSSOVER_GROUP (a launcher's); --group= means none.
    assert fit_synthetic.parse_flags([]).group is None
    assert fit_synthetic.parse_flags(["--group="]).group == ""


@pytest.mark.slow
def test_a_lone_job_trains_as_python_dash_m(child_env, lease_group, tmp_path) -> None:
    """One process, a group of one job (LeaseOptions(jobs=1): it starts at once, through the
    lease op), a tiny model for a few steps: the loss falls and the summary says so."""
    lease_dir = tmp_path / "lease"
    lease_dir.mkdir(mode=0o700)
    done = subprocess.run(
        [sys.executable, "-m", "crossover_tf.examples.fit_synthetic", "--job=solo",
         f"--group={lease_group}", "--group_jobs=1", f"--lease_dir={lease_dir}",
         "--steps=6", "--epochs=3", "--batch_size=32", "--features=8", "--hidden=16"],
        env={**child_env, "CUDA_VISIBLE_DEVICES": ""}, cwd=tmp_path, capture_output=True,
        text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith(fit_synthetic.SUMMARY)]
    summary = json.loads(line[len(fit_synthetic.SUMMARY):])
    assert (summary["job"], summary["rank"], summary["size"]) == ("solo", 0, 1), summary
    assert summary["group"] == lease_group and summary["steps"] == 18, summary
    losses = summary["loss_per_epoch"]
    assert len(losses) == 3 and losses[-1] < losses[0], losses
