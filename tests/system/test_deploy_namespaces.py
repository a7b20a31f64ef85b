"""Containers emulated with namespaces: what the Docker and Kubernetes recipes (deploy/) set up.

Each job runs in its own mount and PID namespace (`unshare --mount --pid --fork --propagation
private --mount-proc`) with a private tmpfs on /dev/shm: what a container (Docker's default
IPC namespace, a Kubernetes pod without hostIPC) gives it. The recipes share one lease
directory between the two: here a host directory bind-mounted into each job's namespace (at a
different path in each, as two containers may mount one volume), CROSSOVER_LEASE_DIR pointing
at it.
  * With the shared directory the two jobs cross: 0 overlapping holds, both finish.
  * Without it (each lease in its own /dev/shm) the join check fails in each job within the
    join timeout, with its message: the lease file it used and the fix.
Seen failing on the code before issue 21: the shared pair overlapped (CROSSOVER_LEASE_DIR was
not read), and the private pair finished with no error.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import time
import uuid

import pytest

from conftest import run_alongside
from slurm_cluster import (MIN_HANDOFFS, STEPS, count_holds, describe_overlap, handoffs,
                           job_env, overlapping_holds, train_command)

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

RUN_TIMEOUT_S = 300.0
JOIN_TIMEOUT_S = 10.0
START_SLACK_S = 90.0  # TensorFlow import and model build before the join check


def _namespaces_usable() -> str | None:
    """Why namespaces cannot be used here (None: they can)."""
    if shutil.which("unshare") is None:
        return "no unshare (util-linux)"
    if os.geteuid() != 0:
        return f"mount namespaces with a tmpfs need root; uid is {os.geteuid()}"
    probe = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--propagation", "private",
                            "--mount-proc", "sh", "-c", "mount -t tmpfs tmpfs /dev/shm"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode:
        return f"unshare/mount failed: {probe.stderr.strip()}"
    return None


@pytest.fixture(scope="module")
def namespaces() -> None:
    reason = _namespaces_usable()
    if reason:
        pytest.skip(reason)


def contained(command: list[str], mount_lease: tuple[pathlib.Path, pathlib.Path] | None,
              cwd: pathlib.Path) -> list[str]:
    """command (run in cwd) in a new mount + PID namespace with a private /dev/shm (and, given
    (host dir, mount point), the host's lease directory bind-mounted at the mount point)."""
    setup = "mount -t tmpfs -o size=256m,mode=1777 tmpfs /dev/shm"
    if mount_lease:
        host, point = mount_lease
        setup += f" && mount --bind {shlex.quote(str(host))} {shlex.quote(str(point))}"
    setup += f" && cd {shlex.quote(str(cwd))}"
    return ["unshare", "--mount", "--pid", "--fork", "--propagation", "private", "--mount-proc",
            "sh", "-c", f'{setup} && exec "$@"', "sh", *command]


def run_contained_pair(tmp_path: pathlib.Path, *, shared: bool, root: pathlib.Path | None = None,
                       join_flags: bool = True, join_timeout_s: float = 120.0) -> dict:
    """Jobs A and B of one new group, each in its own namespaces, with or without the shared
    lease directory; returns their exit codes, outputs, wall times and the overlap numbers."""
    from conftest import REPO_ROOT
    root = root or REPO_ROOT
    group = f"n{uuid.uuid4().hex[:10]}"
    host_lease = tmp_path / "lease"
    host_lease.mkdir()
    commands, env = {}, job_env(root, None)
    for job in ("A", "B"):
        point = tmp_path / f"container{job}" / "crossover"  # where this "container" mounts it
        point.mkdir(parents=True)
        command = train_command(job, group, tmp_path / "model", tmp_path / "barrier",
                                join_flags, join_timeout_s)
        if shared:  # each job's own view of the one directory
            command = ["env", f"CROSSOVER_LEASE_DIR={point}", *command]
        commands[job] = contained(command, (host_lease, point) if shared else None, root)
    start = time.monotonic()
    a, b = run_alongside(commands["A"], commands["B"], env, RUN_TIMEOUT_S)
    wall_s = time.monotonic() - start
    jobs = {}
    for job, proc in (("A", a), ("B", b)):
        stats_path = tmp_path / "model" / job / "stats.json"
        stats = json.loads(stats_path.read_text()) if stats_path.exists() else None
        jobs[job] = {"rc": proc.returncode, "output": proc.stdout,
                     "events": stats["lease_events_ns"] if stats else None,
                     "lease": stats["lease"] if stats else None}
    timelines = {j: v["events"] for j, v in jobs.items() if v["events"] is not None}
    result = {"group": group, "shared": shared, "wall_s": wall_s, "jobs": jobs,
              "overlap": overlapping_holds(timelines) if timelines else None,
              "handoffs": handoffs(timelines) if timelines else None,
              "host_lease_files": sorted(p.name for p in host_lease.iterdir())}
    print(describe(result))
    return result


def describe(result: dict) -> str:
    lines = [f"group {result['group']}, shared lease directory: {result['shared']}, both done "
             f"in {result['wall_s']:.1f} s, files left in the shared directory: "
             f"{result['host_lease_files']}"]
    for job, v in result["jobs"].items():
        lease = v["lease"] or {}
        lines.append(f"  job {job}: exit {v['rc']}, holds {count_holds(v)}, the lease's "
                     f"hand-offs {lease.get('handoffs')}, contended acquires "
                     f"{lease.get('contended')}")
    return "\n".join(lines + describe_overlap(result))


def _outputs(result: dict) -> str:
    return "\n".join(f"--- job {j}:\n{v['output'][-3000:]}" for j, v in result["jobs"].items())


def test_contained_jobs_sharing_a_lease_directory_cross(namespaces, tmp_path) -> None:
    result = run_contained_pair(tmp_path, shared=True)
    assert all(v["rc"] == 0 for v in result["jobs"].values()), _outputs(result)
    overlap = result["overlap"]
    assert overlap["holds"] >= 2 * 2 * STEPS, describe(result)
    assert overlap["overlapped"] == 0, f"{describe(result)}\n{_outputs(result)}"
    assert result["handoffs"] >= MIN_HANDOFFS, describe(result)
    for v in result["jobs"].values():  # each job's lease saw the other job
        assert v["lease"]["handoffs"] > 0 and v["lease"]["contended"] > 0, describe(result)


def test_contained_jobs_without_a_shared_directory_fail_the_join_check(namespaces, tmp_path
                                                                        ) -> None:
    result = run_contained_pair(tmp_path, shared=False, join_timeout_s=JOIN_TIMEOUT_S)
    group = result["group"]
    for job, v in result["jobs"].items():
        out = v["output"]
        assert v["rc"] != 0, f"job {job} finished alone without an error\n{_outputs(result)}"
        assert "GroupIncomplete" in out, out[-3000:]
        # names the lease file it used, what causes this, and the fix
        assert re.search(rf"/dev/shm/crossover\.{group}\.\S+", out), out[-3000:]
        assert "Docker" in out and "Kubernetes" in out, out[-3000:]
        assert "CROSSOVER_LEASE_DIR" in out, out[-3000:]
    assert result["wall_s"] <= JOIN_TIMEOUT_S + START_SLACK_S, describe(result)
