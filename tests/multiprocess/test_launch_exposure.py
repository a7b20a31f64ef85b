"""The launchers' tasks cannot be reached from another host, nor by another local user
(issue 48, item 1; issue 59, items 4, 5 and 10).

TensorFlow's gRPC server binds every interface and runs graphs for whoever connects: from
another network namespace, a plain TensorFlow session against a task's port read a 0600 file of
the job's user. `python -m crossover_tf.launch` preloads its bind guard
(ops/launch/bind_address.c) so the tasks listen on --address alone and accept only their own
user's local connections; these tests show the read still works with
`--listen_on_all_interfaces` (TensorFlow's own behaviour) and is refused without it, from
another host and from another uid on this one. The experiments' launcher preloads the same
guard.
"""
from __future__ import annotations

import contextlib
import functools
import os
import pathlib
import subprocess
import sys
import time
from typing import Callable

import pytest

from conftest import run_bounded
from experiments.cluster import shell
from experiments.cluster.launch import launch_job, wait_jobs
from experiments.cluster.netns import EmulatedCluster
from lease_helpers import OUTSIDER_UID, as_user, needs_other_users

NETNS_OK, NETNS_REASON = shell.netns_usable()
LAUNCH = [sys.executable, "-m", "crossover_tf.launch"]
# A /30 of the benchmarking range (198.18.0.0/15) that the emulated cluster does not use.
ROOT_SIDE, OTHER_SIDE = "198.19.254.1", "198.19.254.2"

# One task: a TensorFlow server from its TF_CONFIG, its listening sockets printed, then up
# until the stop file appears (bounded).
SERVE = """
import json, os, pathlib, subprocess, sys, time
import tensorflow as tf
config = json.loads(os.environ["TF_CONFIG"])
index = config["task"]["index"]
port = config["cluster"]["worker"][index].rpartition(":")[2]
server = tf.distribute.Server(tf.train.ClusterSpec(config["cluster"]), job_name="worker",
                              task_index=index, start=True)
listening = subprocess.run(["ss", "-ltnH", "sport = :" + port], capture_output=True,
                           text=True).stdout.split()
print("PORT", port, "LISTEN", *[w for w in listening if w.endswith(":" + port)], flush=True)
pathlib.Path(sys.argv[1]).write_text(port)
deadline = time.monotonic() + 90
while not pathlib.Path(sys.argv[2]).exists() and time.monotonic() < deadline:
    time.sleep(0.2)
"""

# What someone on another host runs: connect, then read the file through a TF session.
READ = """
import socket, sys
host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    socket.create_connection((host, port), timeout=5).close()
except OSError as err:
    print("UNREACHABLE", type(err).__name__, flush=True)
    sys.exit(0)
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=20000)
with tf.compat.v1.Session("grpc://%s:%d" % (host, port), config=config) as session:
    print("READ", session.run(tf.io.read_file(path)).decode(), flush=True)
"""


def _listen_line(output: str) -> list[str]:
    line = next(line for line in output.splitlines() if "PORT " in line)
    return line.split("LISTEN", 1)[1].split()


def test_the_tasks_listen_on_the_launch_address_alone(child_env, tmp_path):
    """Without any root: the server's socket is bound to 127.0.0.1, not to every interface."""
    stop = tmp_path / "stop"
    stop.touch()  # serve, print, leave
    result = run_bounded([*LAUNCH, "-np", "1", "--timeout_s", "120", "--", sys.executable,
                          "-c", SERVE, str(tmp_path / "port"), str(stop)], child_env, 150)
    assert result.returncode == 0, result.stdout[-4000:]
    bound = _listen_line(result.stdout)
    assert bound and all(b.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:")) for b in bound), \
        result.stdout[-2000:]


def test_the_address_must_be_an_ipv4_literal(child_env):
    result = run_bounded([*LAUNCH, "-np", "1", "--address", "localhost", "--", sys.executable,
                          "-c", "pass"], child_env, 60)
    assert result.returncode == 2 and "must be an IPv4 address" in result.stdout


def test_the_address_of_every_interface_is_refused_naming_the_flag(child_env):
    """--address 0.0.0.0 would silently be --listen_on_all_interfaces: the launch says so."""
    result = run_bounded([*LAUNCH, "-np", "1", "--address", "0.0.0.0", "--", sys.executable,
                          "-c", "print('RAN')"], child_env, 60)
    assert result.returncode == 2 and "--listen_on_all_interfaces" in result.stdout, \
        result.stdout
    assert "RAN" not in result.stdout


# A task's socket that listens without a bind (the kernel binds it to every interface).
LISTEN_UNBOUND = """
import socket
s = socket.socket()
s.listen()
print("LISTENING", s.getsockname()[0], flush=True)
"""


def test_a_socket_listening_unbound_listens_on_the_launch_address(child_env):
    result = run_bounded([*LAUNCH, "-np", "1", "--", sys.executable, "-c", LISTEN_UNBOUND],
                         child_env, 60)
    assert result.returncode == 0 and "LISTENING 127.0.0.1" in result.stdout, result.stdout


@pytest.mark.parametrize("emulated", [
    False, pytest.param(True, marks=[pytest.mark.slow, pytest.mark.netns, pytest.mark.skipif(
        not NETNS_OK, reason=f"needs root and ip netns: {NETNS_REASON}")])])
def test_the_experiments_launchers_tasks_listen_on_their_hosts_address_alone(
        child_env, tmp_path, monkeypatch, emulated):
    """Issue 59 item 4: experiments/cluster/launch.py's tensorflow ranks listened on *:PORT."""
    for name in ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL"):
        monkeypatch.setenv(name, child_env[name])
    stop = tmp_path / "stop"
    stop.touch()  # serve, print, leave
    with EmulatedCluster(num_hosts=2, force_localhost=not emulated) as cluster:
        job = launch_job(cluster, [sys.executable, "-c", SERVE, str(tmp_path / "port"),
                                   str(stop)], job_name="exposed", log_dir=tmp_path,
                         timeout_s=120, backend="tensorflow")
        result = wait_jobs([job])["exposed"]
        addresses = [host.address for host in cluster.hosts]
    assert result["ok"], result
    for log, address in zip(result["logs"], addresses):
        bound = _listen_line(pathlib.Path(log).read_text())
        assert bound and all(b.startswith((f"{address}:", f"[::ffff:{address}]:"))
                             for b in bound), (address, bound)


@contextlib.contextmanager
def _other_host():
    """A network namespace joined to this one by a veth pair: ROOT_SIDE here, OTHER_SIDE
    there, as another host on the job's network sees it. Removed on the way out."""
    tag = f"ctfx{os.getpid() % 10000}"
    ns, here, there = tag, f"{tag}a", f"{tag}b"
    commands = [["ip", "netns", "add", ns],
                ["ip", "link", "add", here, "type", "veth", "peer", "name", there],
                ["ip", "link", "set", there, "netns", ns],
                ["ip", "addr", "add", f"{ROOT_SIDE}/30", "dev", here],
                ["ip", "link", "set", here, "up"],
                ["ip", "-n", ns, "addr", "add", f"{OTHER_SIDE}/30", "dev", there],
                ["ip", "-n", ns, "link", "set", there, "up"],
                ["ip", "-n", ns, "link", "set", "lo", "up"]]
    try:
        for command in commands:
            subprocess.run(command, check=True, capture_output=True, timeout=30)
        yield ns
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _read_from(ns: str, port: str, secret: pathlib.Path, env: dict[str, str]) -> str:
    result = run_bounded(["ip", "netns", "exec", ns, sys.executable, "-c", READ, ROOT_SIDE,
                          port, str(secret)], env, 120)
    return result.stdout


def _read_as(uid: int, port: str, secret: pathlib.Path, env: dict[str, str]) -> str:
    """The read from this machine's loopback, as uid (root's own: 0)."""
    reader = [sys.executable, "-c", READ, "127.0.0.1", port, str(secret)]
    command = as_user(uid, (), *reader) if uid else reader
    return run_bounded(command, {**env, "HOME": "/tmp"}, 120).stdout


Reader = Callable[[str, pathlib.Path, dict[str, str]], str]  # (port, secret, env) -> output


def _serve_and_read(tmp_path: pathlib.Path, env: dict[str, str], read: Reader,
                    *launch_flags: str) -> tuple[str, str]:
    """Starts one launched task serving, reads the secret with read(port, secret, env);
    (reader's, task's) output."""
    port_file, stop = tmp_path / "port", tmp_path / "stop"
    port_file.unlink(missing_ok=True)
    stop.unlink(missing_ok=True)
    secret = tmp_path / "secret"
    secret.write_text("the job user's secret")
    secret.chmod(0o600)
    task = subprocess.Popen([*LAUNCH, "-np", "1", "--timeout_s", "150", *launch_flags, "--",
                             sys.executable, "-c", SERVE, str(port_file), str(stop)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(600):  # up to 60 s for TensorFlow to start
            if port_file.exists() or task.poll() is not None:
                break
            time.sleep(0.1)
        assert port_file.exists(), "the task never served"
        reader_output = read(port_file.read_text(), secret, env)
    finally:
        stop.touch()
        output, _ = task.communicate(timeout=60)
    return reader_output, output


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.skipif(not NETNS_OK, reason=f"needs root and ip netns: {NETNS_REASON}")
def test_another_host_reads_a_file_through_an_open_task_but_not_a_launched_one(
        child_env, tmp_path):
    with _other_host() as ns:
        # TensorFlow's own behaviour: the read from the other host works (the hole).
        from_there = functools.partial(_read_from, ns)
        opened, _ = _serve_and_read(tmp_path, child_env, from_there, "--address", "127.0.0.1",
                                    "--listen_on_all_interfaces")
        assert "READ the job user's secret" in opened, opened[-3000:]
        # The launcher's default: the port is not reachable from there at all.
        guarded, task = _serve_and_read(tmp_path, child_env, from_there)
        assert "UNREACHABLE ConnectionRefusedError" in guarded, guarded[-3000:]
        assert "READ" not in guarded
        assert all(b.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:"))
                   for b in _listen_line(task)), task[-2000:]


@pytest.mark.multiprocess
@pytest.mark.slow
@needs_other_users
def test_another_local_user_cannot_open_a_session_on_a_launched_task(child_env, tmp_path):
    """Issue 59 item 5: 127.0.0.1 is every local user's. The job's own user (root here) still
    runs graphs on its task; another uid's TensorFlow session gets nothing."""
    own, _ = _serve_and_read(tmp_path, child_env, functools.partial(_read_as, 0))
    assert "READ the job user's secret" in own, own[-3000:]
    other, _ = _serve_and_read(tmp_path, child_env, functools.partial(_read_as, OUTSIDER_UID))
    assert "READ" not in other, other[-3000:]
    # The task closes the connection unread: the session's calls run out of time.
    assert "DeadlineExceededError" in other or "UnavailableError" in other, other[-3000:]
