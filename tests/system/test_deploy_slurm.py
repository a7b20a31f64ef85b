"""The Slurm recipes (deploy/slurm/) on a real one-node Slurm with job_container/tmpfs.

tests/support/slurm_cluster.py starts Debian's slurm-wlm 22.05 (scripts/install_slurm.sh
installs it) with munged, slurmctld and slurmd on this host; every job gets a private /tmp and
/dev/shm, as on a real cluster. Two `sbatch` jobs each train experiments/train.py (one rank,
no horovodrun) in one crossover group on the node's one device (cpu0):
  * with the recipe (deploy/slurm/crossover_job.sbatch: CROSSOVER_LEASE_DIR on a node-local
    directory outside the plugin's Dirs) they cross: lease events alternate, 0 overlapping
    holds, both finish;
  * the same pair without it (each job's lease in its own /dev/shm) fails loudly: the join
    error in each job's output, a nonzero exit, within the join timeout (before the join
    check, both computed at once with no error; the numbers are in issue 21's closing note);
  * deploy/slurm/crossover_steps.sbatch's two `srun --overlap` steps of one allocation cross,
    and so does the line crossover-plan pair --slurm writes for a crossed pair, as written.
The jobs run the checkout and venv wherever they are: one under /tmp, hidden from them by
their private /tmp, is bind-mounted read-only under the cluster's /var/tmp directory for them
(cluster.root, cluster.python). Skips, saying why, where Slurm cannot be installed or started.
"""
from __future__ import annotations

import datetime
import json
import pathlib
import re
import subprocess
import sys
import textwrap
import uuid
from typing import Iterator

import pytest

from conftest import REPO_ROOT
from slurm_cluster import (MIN_HANDOFFS, STEPS, SlurmCluster, describe, handoffs, job_env,
                           overlapping_holds, running_cluster, train_command)

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

JOB_SCRIPT = REPO_ROOT / "deploy" / "slurm" / "crossover_job.sbatch"
STEPS_SCRIPT = REPO_ROOT / "deploy" / "slurm" / "crossover_steps.sbatch"
TENSORFLOW_SCRIPT = REPO_ROOT / "deploy" / "slurm" / "crossover_tensorflow.sbatch"
JOB_TIMEOUT_S = 300.0        # both jobs, start to end, on 2 shared cores
JOIN_TIMEOUT_S = 10.0        # the failing pair: how long each job waits for its peer
START_SLACK_S = 90.0         # TensorFlow import and model build before the join check


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """munged, slurmctld and slurmd started for this module's tests, stopped by pid after."""
    yield from running_cluster()


def run_pair(cluster: SlurmCluster, *, recipe: bool, join_flags: bool = True,
             join_timeout_s: float = 120.0, timeout_s: float = JOB_TIMEOUT_S) -> dict:
    """Submits jobs A and B of one new group (with the recipe: through crossover_job.sbatch,
    CROSSOVER_LEASE_DIR on a directory under the cluster's /var/tmp base; without: the same
    command with `sbatch --wrap`), waits (bounded) and returns each job's record, output and
    lease timeline, and the overlap numbers."""
    group = f"s{uuid.uuid4().hex[:10]}"
    run_dir = cluster.base / "runs" / group
    lease_dir = run_dir / "lease" if recipe else None
    run_dir.mkdir(parents=True)
    env = job_env(cluster.root, lease_dir)
    ids = {}
    for job in ("A", "B"):
        command = train_command(job, group, run_dir / "model", run_dir / "barrier",
                                join_flags, join_timeout_s, python=cluster.python)
        args = ["--job-name", f"xo-{job}", "--mem=2G", "--ntasks=1", "--cpus-per-task=1",
                f"--chdir={cluster.root}"]
        if recipe:
            args += [str(JOB_SCRIPT), *command]
        else:
            args += ["--wrap", " ".join(command)]
        ids[job] = cluster.sbatch(args, env=env)
    records = cluster.wait(ids.values(), timeout_s=timeout_s)
    return summarize(cluster, group, run_dir, ids, records, lease_dir)


def summarize(cluster: SlurmCluster, group: str, run_dir: pathlib.Path, ids: dict[str, str],
              records: dict[str, dict[str, str]], lease_dir: pathlib.Path | None) -> dict:
    jobs = {}
    for job, job_id in ids.items():
        record = records[job_id]
        stats_path = run_dir / "model" / job / "stats.json"
        stats = json.loads(stats_path.read_text()) if stats_path.exists() else None
        jobs[job] = {"id": job_id, "state": record.get("JobState"),
                     "exit": record.get("ExitCode"), "wall_s": _wall_s(record),
                     "output": cluster.output(job_id),
                     "events": stats["lease_events_ns"] if stats else None,
                     "device_key": stats["device_key"] if stats else None,
                     "lease": stats["lease"] if stats else None}
    timelines = {j: v["events"] for j, v in jobs.items() if v["events"] is not None}
    result = {"group": group, "lease_dir": str(lease_dir) if lease_dir else "/dev/shm (private)",
              "jobs": jobs, "overlap": overlapping_holds(timelines) if timelines else None,
              "handoffs": handoffs(timelines) if timelines else None}
    print(describe(result))
    return result


def _wall_s(record: dict[str, str]) -> float | None:
    try:
        start, end = (datetime.datetime.fromisoformat(record[k]) for k in ("StartTime",
                                                                           "EndTime"))
    except (KeyError, ValueError):
        return None
    return (end - start).total_seconds()


def _tails(result: dict) -> str:
    return "\n".join(f"--- job {j} output:\n{v['output'][-3000:]}"
                     for j, v in result["jobs"].items())


def test_slurm_recipe_pair_crosses(slurm_cluster: SlurmCluster) -> None:
    result = run_pair(slurm_cluster, recipe=True)
    for job, v in result["jobs"].items():
        assert (v["state"], v["exit"]) == ("COMPLETED", "0:0"), f"job {job}\n{_tails(result)}"
        assert f"lease directory {result['lease_dir']}" in v["output"], v["output"][-2000:]
    overlap = result["overlap"]
    assert overlap["holds"] >= 2 * 2 * STEPS, result  # a compute and an apply hold a step
    assert overlap["overlapped"] == 0, f"{describe(result)}\n{_tails(result)}"
    assert result["handoffs"] >= MIN_HANDOFFS, describe(result)  # the jobs' holds alternate
    for job, v in result["jobs"].items():  # and each job's lease saw the other one
        assert v["lease"]["handoffs"] > 0 and v["lease"]["contended"] > 0, describe(result)


def test_slurm_pair_without_lease_dir_fails_loudly(slurm_cluster: SlurmCluster) -> None:
    result = run_pair(slurm_cluster, recipe=False, join_timeout_s=JOIN_TIMEOUT_S)
    group = result["group"]
    for job, v in result["jobs"].items():
        out = v["output"]
        print(f"job {job}: " + next((ln for ln in out.splitlines() if "GroupIncomplete:" in ln),
                                    "(no GroupIncomplete line)"))
        assert v["state"] == "FAILED" and v["exit"] != "0:0", f"job {job}\n{_tails(result)}"
        assert "GroupIncomplete" in out, out[-3000:]
        assert re.search(rf"/dev/shm/crossover\.{group}\.\S+", out), out[-3000:]
        assert "CROSSOVER_LEASE_DIR" in out and "Slurm" in out, out[-3000:]
        assert v["wall_s"] is not None and v["wall_s"] <= JOIN_TIMEOUT_S + START_SLACK_S, \
            describe(result)


def test_slurm_steps_recipe_crosses(slurm_cluster: SlurmCluster) -> None:
    """One allocation, two `srun --overlap` steps (they share the job's /dev/shm)."""
    group = f"s{uuid.uuid4().hex[:10]}"
    run_dir = slurm_cluster.base / "runs" / group
    run_dir.mkdir(parents=True)
    env = job_env(slurm_cluster.root, None)
    for job in ("A", "B"):
        env[f"CROSSOVER_COMMAND_{job}"] = " ".join(train_command(
            job, group, run_dir / "model", run_dir / "barrier", python=slurm_cluster.python))
    _assert_steps_cross(slurm_cluster, group, run_dir, env, str(STEPS_SCRIPT))


def test_slurm_tensorflow_recipe_crosses_two_rank_jobs_without_horovod(
        slurm_cluster: SlurmCluster) -> None:
    """deploy/slurm/crossover_tensorflow.sbatch (issue 33): two jobs of two ranks each, their
    ranks started by srun and found by SlurmClusterResolver, cross on the node's devices."""
    group = f"s{uuid.uuid4().hex[:10]}"
    run_dir = slurm_cluster.base / "runs" / group
    run_dir.mkdir(parents=True)
    env = job_env(slurm_cluster.root, None)
    for job in ("A", "B"):
        env[f"CROSSOVER_COMMAND_{job}"] = " ".join(train_command(
            job, group, run_dir / "model", run_dir / "barrier", True, 120.0,
            "--backend=tensorflow", processes=4, python=slurm_cluster.python))
    # The recipe asks for two nodes, one rank each; the test cluster is one node of two devices
    # (cpu0, cpu1): the layout the recipe's header gives for a multi-device node.
    _assert_steps_cross(slurm_cluster, group, run_dir, env, str(TENSORFLOW_SCRIPT),
                        layout=("--nodes=1", "--ntasks-per-node=2"))
    for job in ("A", "B"):  # each job had two ranks, one per device (cpu0, cpu1)
        stats = [json.loads((run_dir / "model" / job / name).read_text())
                 for name in ("stats.json", "stats.rank1.json")]
        assert [(s["rank"], s["size"]) for s in stats] == [(0, 2), (1, 2)], stats
        assert stats[0]["device_key"] != stats[1]["device_key"], stats


def test_planner_launch_line_runs_as_written(slurm_cluster: SlurmCluster) -> None:
    """crossover-plan pair --slurm's line for a crossed pair, submitted as it is (issue 25
    item 4): the planner fills in the group, the job count and the join timeout."""
    import crossover_tf_planner as planner
    from crossover_tf_planner import launch_lines
    from launch_line_helpers import PROFILES, parse
    plan = planner.pair(PROFILES)
    run_dir = slurm_cluster.base / "runs" / f"plan{uuid.uuid4().hex[:8]}"
    run_dir.mkdir(parents=True)
    commands = {job: " ".join(train_command(job, "", run_dir / "model", run_dir / "barrier",
                                            join_flags=False, python=slurm_cluster.python))
                for job in ("A", "B")}
    (launch,) = launch_lines.slurm_launches(plan, commands)
    assert launch.recommendation == "cross", plan.to_markdown()
    assignments, words = parse(launch.line)
    assert words == ["sbatch", launch_lines.STEPS_RECIPE]
    env = {**job_env(slurm_cluster.root, None), **assignments}
    _assert_steps_cross(slurm_cluster, launch.group, run_dir, env, str(REPO_ROOT / words[1]))


def _assert_steps_cross(cluster: SlurmCluster, group: str, run_dir: pathlib.Path,
                        env: dict[str, str], script: str, layout: tuple[str, ...] = ()) -> None:
    job_id = cluster.sbatch([f"--chdir={cluster.root}", *layout, script], env=env)
    records = cluster.wait([job_id], timeout_s=JOB_TIMEOUT_S)
    result = summarize(cluster, group, run_dir, {"A": job_id, "B": job_id},
                       {job_id: records[job_id]}, None)
    output = result["jobs"]["A"]["output"]
    assert records[job_id]["JobState"] == "COMPLETED", output[-4000:]
    assert "step A exited 0, step B exited 0" in output, output[-4000:]
    assert result["overlap"]["overlapped"] == 0, describe(result)
    assert result["handoffs"] >= MIN_HANDOFFS, describe(result)
    assert result["jobs"]["A"]["lease"]["handoffs"] > 0, describe(result)


def test_jobs_reach_a_checkout_and_venv_under_tmp(slurm_cluster: SlurmCluster,
                                                  tmp_path: pathlib.Path) -> None:
    """Issue 51 item 8: a clone under /tmp (pytest's tmp_path is there too) is hidden from the
    jobs by job_container/tmpfs; the cluster bind-mounts it, read-only, under its /var/tmp base
    and the jobs run from there: the checkout's code, the venv's Python."""
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / "probe_51.py").write_text("WHERE = __file__\n")
    seen = slurm_cluster.expose(clone)
    assert not any(str(seen).startswith(d) for d in ("/tmp/", "/dev/shm/")), seen
    assert slurm_cluster.expose(clone / "probe_51.py") == seen / "probe_51.py"
    env = job_env(slurm_cluster.root, None)
    env["PYTHONPATH"] += f":{seen}"
    code = ("import sys, crossover_tf, probe_51; "
            "print('probe', probe_51.WHERE, crossover_tf.__file__, sys.prefix)")
    job_id = slurm_cluster.sbatch(["--mem=1G", f"--chdir={seen}", "--wrap",
                                   f"{slurm_cluster.python} -c \"{code}\""], env=env)
    record = slurm_cluster.wait([job_id], timeout_s=120)[job_id]
    output = slurm_cluster.output(job_id)
    assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), output
    (line,) = [ln for ln in output.splitlines() if ln.startswith("probe ")]
    print(f"job {job_id}: {line}")
    _, probe, package, prefix = line.split()
    assert probe == str(seen / "probe_51.py"), line
    assert package.startswith(f"{slurm_cluster.root}/"), (line, slurm_cluster.root)
    assert prefix == str(slurm_cluster.expose(pathlib.Path(sys.prefix))), line
    with pytest.raises(OSError):  # read-only: a job (or a cleanup) cannot change the clone
        (seen / "written_by_test").write_text("x")


def test_the_test_command_lists_each_skip_with_its_reason(tmp_path: pathlib.Path) -> None:
    """Issue 51 item 8: pyproject.toml's pytest addopts list every skipped test, by name, with
    its reason, at the end of the run, so a skip that should not happen shows (pytest folds
    skips raised at one place into one line unless told not to)."""
    (tmp_path / "test_two_skips.py").write_text(textwrap.dedent("""
        import pytest

        def need_probe():
            pytest.skip("no probe here")

        def test_first():
            need_probe()

        def test_second():
            need_probe()
        """))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(REPO_ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = result.stdout.split("short test summary info")[-1]
    for test in ("test_first", "test_second"):  # one line each: its name and its reason
        assert re.search(rf"^SKIPPED test_two_skips\.py::{test} - .*no probe here$", summary,
                         re.MULTILINE), result.stdout
