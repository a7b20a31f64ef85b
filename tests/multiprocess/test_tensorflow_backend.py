"""The tensorflow communication backend's own behaviour (issue 33): how it reads its cluster,
what it refuses, and that a peer that dies or stops fails the job instead of hanging it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import ERROR_LINE, WORKERS, launch_command, run_bounded
from crossover_tf import CommunicationOptions
from crossover_tf.launch import free_ports, tf_configs

WORKER = str(WORKERS / "collective_worker.py")
FAIL_AT = 5  # the step at which collective_worker.py's rank 1 dies or stops


@pytest.mark.parametrize("kwargs, message", [
    ({"backend": "mpi"}, "backend must be one of"),
    ({"backend": "tensorflow", "compression": object()}, "compression is Horovod's"),
    ({"cluster_resolver": object()}, "cluster_resolver is for backend='tensorflow'"),
    ({"backend": "tensorflow", "collective_timeout_s": 0}, "timeout"),
])
def test_communication_options_refuse_settings_of_the_other_backend(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CommunicationOptions(**kwargs)


def test_slurm_ports_are_the_same_for_a_steps_tasks_and_differ_between_steps():
    from crossover_tf._communication.tensorflow import slurm_port_base
    step0 = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0"}
    assert slurm_port_base(step0) == slurm_port_base(dict(step0))
    assert slurm_port_base(step0) != slurm_port_base({**step0, "SLURM_STEP_ID": "1"})
    assert 20000 <= slurm_port_base(step0) <= 60000 - 16
    assert slurm_port_base({**step0, "CROSSOVER_TF_PORT_BASE": "31000"}) == 31000


def test_local_coordinates_count_the_ranks_on_this_rank_host():
    import tensorflow as tf
    from crossover_tf._communication.tensorflow import _local_coordinates
    spec = tf.train.ClusterSpec({"worker": ["a:1", "b:1", "a:2", "b:2", "a:3"]})
    assert [_local_coordinates(spec, r) for r in range(5)] == [(0, 3), (0, 2), (1, 3),
                                                               (1, 2), (2, 3)]


def test_the_coordination_leader_alone_outlives_the_other_tasks_at_exit(monkeypatch):
    """The leader (chief 0, else worker 0) waits at exit for every other task's server to refuse
    connections (its process ended); the other tasks wait for nobody."""
    import socket

    from tensorflow.python.distribute.cluster_resolver import TFConfigClusterResolver

    from crossover_tf._communication.tensorflow import TensorFlowCommunicator, _still_running

    def outlive(cluster: dict, task_type: str, index: int) -> list[str]:
        monkeypatch.setenv("TF_CONFIG", json.dumps(
            {"cluster": cluster, "task": {"type": task_type, "index": index}}))
        return TensorFlowCommunicator(TFConfigClusterResolver())._outlive

    workers = {"worker": ["a:1", "b:2", "c:3"]}
    assert outlive(workers, "worker", 0) == ["b:2", "c:3"]
    assert outlive(workers, "worker", 2) == []
    with_chief = {"chief": ["h:9"], **workers}
    assert outlive(with_chief, "chief", 0) == ["a:1", "b:2", "c:3"]
    assert outlive(with_chief, "worker", 0) == []
    server = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{server.getsockname()[1]}"
    assert _still_running(address)
    server.close()
    assert not _still_running(address)


def _run_pair(tmp_path, *flags: str, ranks: int = 2) -> tuple[list[dict], float]:
    """Ranks started directly with their TF_CONFIG (no launcher stopping the survivor)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    procs = [subprocess.Popen([sys.executable, WORKER, str(tmp_path / "r_RANK.json"), *flags],
                              env={**env, "TF_CONFIG": config}, start_new_session=True)
             for config in tf_configs([f"127.0.0.1:{port}"
                                       for port in free_ports("127.0.0.1", ranks)])]
    start = time.monotonic()
    try:
        procs[0].wait(timeout=120)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
            proc.wait()
    return json.loads((tmp_path / "r_0.json").read_text()), time.monotonic() - start


@pytest.mark.multiprocess
@pytest.mark.slow
def test_three_ranks_average_fuse_dtypes_and_gather_in_rank_order(tmp_path):
    record, _ = _run_pair(tmp_path, ranks=3)
    assert (record["size"], record["steps"], record["error"]) == (3, 20, None)
    assert record["value"] == pytest.approx(2.0)  # the mean of 1, 2, 3
    assert record["mixed"] == [[3.0] * 3, [[6, 6], [6, 6]], [3.0]]  # sums, dtypes kept
    assert record["gathered"] == [{"rank": r, "pad": "x" * r} for r in range(3)]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("peer, errors", [
    ("exit", {"UnavailableError"}),
    # Whichever notices first: the collective's timeout, or the coordination service's
    # heartbeat (it aborts the collectives as unavailable).
    ("stop", {"DeadlineExceededError", "UnavailableError"})])
def test_a_peer_that_dies_or_stops_fails_the_collective_instead_of_hanging(
        tmp_path, peer, errors):
    """A dead peer resets the connection at once; a stopped one (no process exit to see) is
    caught by the collective's timeout (--timeout_s 10) or the heartbeat, never a wait
    without end. The survivor fails in step 5 (the peer never joins it) or, when the peer
    exits the moment its own share of step 4 is done, in step 4 (the survivor was still
    fetching the peer's last buffer: 'RecvBuf ... Socket closed'; seen once in a fresh-clone
    run). Either way it is an error, not a wait, and no later step succeeds."""
    record, _ = _run_pair(tmp_path, "--peer", peer, "--timeout_s", "10")
    assert record["steps"] in (FAIL_AT - 1, FAIL_AT) and record["error"] in errors, record
    assert record["elapsed_s"] < 60, record


# What a run that succeeded must not print (issues 51 and 60): a glog error line, the
# coordination service's words for a task it took for crashed or for a heartbeat that failed,
# or our own warning that a rank left without the others.
EXIT_ERRORS = ("unhealthy", "Connection refused", "heartbeat", "leaving without every rank")


def _exit_error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines()
            if ERROR_LINE.match(line) or any(marker in line for marker in EXIT_ERRORS)]


# The skewed exits: (rank left behind, seconds it stays after its work, seconds it then lags
# after the ranks' meeting at exit). 13 s is past the coordination service's default heartbeat
# timeout (10 s); a lag after the meeting is what a slow interpreter teardown does on a busy
# machine (seen: 2 to 37 s of garbage collection at exit with 2 cores shared by 6 to 12 TF
# processes): 8 s left the peer to fail its next heartbeat to the gone leader, 12 s left the
# leader to take the gone peer for crashed.
SKEWED_EXITS = [(rank, 13.0 if i == 0 else 5.0, (0.0, 8.0, 0.0, 12.0)[i % 4])
                for i in range(10) for rank in (0, 1)]
SKEWED_AT_ONCE = 4  # runs side by side: on 2 cores they load each other, as a busy node does


@pytest.mark.multiprocess
@pytest.mark.slow
def test_successful_runs_end_without_error_lines_whatever_the_exit_skew(tmp_path, child_env):
    """Issues 51 and 60 (item 6): in 20 runs of 2 ranks, one rank (each in turn) stays after its
    work (rank 0 saving a model, say) and in half of them lags after the meeting at exit too.
    Before issue 51 the coordination service took the rank that left first for a crashed one
    (`E... tasks are unhealthy`), or the rank left behind failed its heartbeat to the gone
    leader (`E... Connection refused`), on a run that succeeded. After it (the ranks met at
    exit) 3 of 19 runs of a busy machine still printed those lines about 10 s after the meeting:
    the ranks' teardowns, seconds long, ended apart. Every run must end with status 0 and no
    such line."""
    env = {**child_env, "TF_CPP_MIN_LOG_LEVEL": "2"}  # the ERROR lines stay, INFO/WARNING go

    def run(i: int) -> subprocess.CompletedProcess:
        rank, linger_s, lag_s = SKEWED_EXITS[i]
        return run_bounded(launch_command(
            "tensorflow", 2, sys.executable, WORKER, str(tmp_path / f"run{i}_RANK.json"),
            "--steps", "3", "--timeout_s", "60", "--linger_rank", str(rank), "--linger_s",
            str(linger_s), "--exit_lag_s", str(lag_s)), env, 150)

    start = time.monotonic()
    with ThreadPoolExecutor(SKEWED_AT_ONCE) as pool:
        results = list(pool.map(run, range(len(SKEWED_EXITS))))
    elapsed = time.monotonic() - start
    failed = {i: (result.returncode, _exit_error_lines(result.stdout))
              for i, result in enumerate(results)
              if result.returncode != 0 or _exit_error_lines(result.stdout)}
    assert not failed, "\n".join(
        [f"{len(failed)} of {len(results)} runs failed or printed error lines"]
        + [f"run {i} (rank left behind, stay s, lag s) {SKEWED_EXITS[i]}: status {status}, "
           f"{len(lines)} error lines, first: {lines[0][:300] if lines else None}"
           for i, (status, lines) in failed.items()]
        + [results[min(failed)].stdout[-3000:]])
    for i in range(len(results)):
        assert json.loads((tmp_path / f"run{i}_1.json").read_text())["steps"] == 3
    print(f"{len(results)} skewed runs in {elapsed:.0f} s")
    assert elapsed < 300, elapsed


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_failed_run_still_names_its_cause_and_ends_promptly(tmp_path, child_env):
    """A rank that raises leaves at once, without waiting for its peers at exit: the job fails
    with the rank's own error, long before the collectives' timeout (60 s here) would end it."""
    start = time.monotonic()
    result = run_bounded(launch_command(
        "tensorflow", 2, sys.executable, WORKER, str(tmp_path / "r_RANK.json"), "--peer",
        "raise", "--timeout_s", "60"), child_env, 180)
    elapsed = time.monotonic() - start
    assert result.returncode == 1, result.stdout[-4000:]
    assert "RuntimeError: rank 1 fails on purpose at step 5" in result.stdout, \
        result.stdout[-4000:]
    assert elapsed < 55, (elapsed, result.stdout[-4000:])
