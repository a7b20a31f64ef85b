"""crossover-plan pair's Slurm launches: each recommended pair becomes one line of the steps
recipe, filled in (group, job count, join timeout, link turn positions), that parses as a
shell command with the recipe's variables; a naive pair launches without a group."""
from __future__ import annotations

import dataclasses
import shlex

import pytest

import crossover_tf_planner as planner
from crossover_tf_planner import cli, launch_lines

from launch_line_helpers import PROFILES, parse


def with_policy(plan: planner.PairingPlan, recommendation: str,
                policy: str) -> planner.PairingPlan:
    pairs = [dataclasses.replace(p, recommendation=recommendation, policy=policy)
             for p in plan.pairs]
    return dataclasses.replace(plan, pairs=pairs)


@pytest.fixture(scope="module")
def plan() -> planner.PairingPlan:
    result = planner.pair(PROFILES)
    assert [(p.job_a, p.job_b) for p in result.pairs] == [("A", "B")]
    return result


@pytest.mark.parametrize("policy, turns", [("crossover", False), ("crossover_turn", True)])
def test_a_crossed_pair_launches_both_jobs_in_one_group(plan, policy, turns):
    (launch,) = launch_lines.slurm_launches(
        with_policy(plan, "cross", policy), {"A": "python train_a.py --lr=0.1"},
        sbatch_options="--gres=gpu:1")
    env, command = parse(launch.line)
    assert command == ["sbatch", "--gres=gpu:1", launch_lines.STEPS_RECIPE]
    assert set(env) == {"CROSSOVER_COMMAND_A", "CROSSOVER_COMMAND_B"}
    a, b = (shlex.split(env[f"CROSSOVER_COMMAND_{s}"]) for s in "AB")
    assert a[:3] == ["python", "train_a.py", "--lr=0.1"]
    # the default command: the example job pip installs (experiments/ is a checkout's only)
    assert b[:4] == ["python", "-m", "crossover_tf.examples.fit_synthetic", "--job=B"]
    for words in (a, b):
        assert f"--group={launch.group}" in words and "--group_jobs=2" in words
        assert "--join_timeout_s=600" in words
    assert launch.group.startswith("xo0-") and len(launch.group) <= 64
    assert [w for w in a + b if w.startswith("--link_turn")] == (
        ["--link_turn=0", "--link_turn=1"] if turns else [])


def test_a_naive_pair_is_co_located_without_a_lease(plan):
    (launch,) = launch_lines.slurm_launches(with_policy(plan, "naive", "naive"))
    env, _ = parse(launch.line)
    assert launch.group == "" and not any("--group" in v for v in env.values())


def test_command_line_writes_the_launch_script(tmp_path, capsys):
    paths = []
    for profile in PROFILES:
        paths.append(str(tmp_path / f"{profile.name}.json"))
        profile.to_json(paths[-1])
    script = tmp_path / "launch.sh"
    assert cli.run(["pair", *paths, "--slurm", str(script), "--command",
                    "A=python a.py"]) == 0
    text = script.read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith(("#", "set"))]
    assert len(lines) == 1 and "CROSSOVER_COMMAND_A='python a.py --group=" in lines[0]
    assert "# Unpaired (run alone): C" in text
    assert cli.run(["pair", *paths, "--slurm", "-", "--command", "no-equals"]) == \
        cli.EXIT_BAD_INPUT
    assert "JOB=COMMAND" in capsys.readouterr().err
