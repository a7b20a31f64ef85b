"""python -m crossover_tf.launch: N local tasks with their TF_CONFIG, as horovodrun starts
Horovod ranks; a failed task stops the others, and nothing outlives --timeout_s."""
from __future__ import annotations

import json
import sys
import time

from conftest import run_bounded

LAUNCH = [sys.executable, "-m", "crossover_tf.launch"]


def test_each_task_gets_its_own_worker_index_in_one_cluster(child_env):
    show = "import os; print('CONFIG', os.environ['TF_CONFIG'])"
    result = run_bounded([*LAUNCH, "-np", "3", "--", sys.executable, "-c", show], child_env, 60)
    assert result.returncode == 0, result.stdout
    configs = {}
    for line in result.stdout.splitlines():
        prefix, _, rest = line.partition(": CONFIG ")
        if rest:
            configs[int(prefix.strip("[]"))] = json.loads(rest)
    assert sorted(configs) == [0, 1, 2]
    clusters = {json.dumps(c["cluster"]) for c in configs.values()}
    assert len(clusters) == 1
    workers = configs[0]["cluster"]["worker"]
    assert len(set(workers)) == 3 and all(w.startswith("127.0.0.1:") for w in workers)
    assert [configs[r]["task"] for r in range(3)] == [{"type": "worker", "index": r}
                                                      for r in range(3)]


def test_a_failed_task_stops_its_peers_with_its_status(child_env):
    """A peer left waiting in a collective would wait for its timeout: the launcher ends it."""
    script = ("import json, os, sys, time\n"
              "if json.loads(os.environ['TF_CONFIG'])['task']['index'] == 1: sys.exit(3)\n"
              "time.sleep(120)\n")
    start = time.monotonic()
    result = run_bounded([*LAUNCH, "-np", "2", "--", sys.executable, "-c", script],
                         child_env, 60)
    assert result.returncode == 3, result.stdout
    assert time.monotonic() - start < 30


def test_past_its_timeout_every_task_is_killed(child_env):
    start = time.monotonic()
    result = run_bounded([*LAUNCH, "-np", "2", "--timeout_s", "2", "--", sys.executable, "-c",
                          "import time; time.sleep(120)"], child_env, 60)
    assert result.returncode == 124, result.stdout
    assert "past 2.0 s" in result.stdout and time.monotonic() - start < 30


def test_a_launch_without_a_command_is_refused(child_env):
    result = run_bounded([*LAUNCH, "-np", "2"], child_env, 60)
    assert result.returncode == 2 and "no command given" in result.stdout


def test_the_tasks_die_with_a_killed_launcher(child_env, tmp_path):
    """SIGKILL runs none of the launcher's clean-up; the kernel's parent-death signal must
    still end the tasks, or they would keep their ports and lease for their own timeouts."""
    import os
    import signal
    import subprocess
    script = ("import os, pathlib, sys, time\n"
              f"pathlib.Path({str(tmp_path)!r}, str(os.getpid())).touch()\n"
              "time.sleep(120)\n")
    launcher = subprocess.Popen([*LAUNCH, "-np", "2", "--", sys.executable, "-c", script],
                                env=child_env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = [int(p.name) for p in tmp_path.iterdir()]
        assert len(pids) == 2
        launcher.kill()
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in pids), pids
    finally:
        for pid in [int(p.name) for p in tmp_path.iterdir()]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """pid runs and is not a zombie (a dead task waits for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_task_killed_by_a_signal_reports_128_plus_its_number(child_env):
    script = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    result = run_bounded([*LAUNCH, "-np", "1", "--", sys.executable, "-c", script],
                         child_env, 60)
    assert result.returncode == 128 + 9, result.stdout
