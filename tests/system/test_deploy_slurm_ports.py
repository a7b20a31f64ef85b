"""deploy/slurm/crossover_tf_ports.sh, the Slurm Prolog/Epilog/TaskProlog that fences a
TensorFlow-backend job's ports to its nodes and user (issue 59, item 5), run for real: its rules
loaded by nft into a network namespace standing for a job's node (never this machine's own),
a listener there on every interface as TensorFlow's server, and connections from root (the
job's user here), another uid, and another "host" joined by a veth pair."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from typing import Iterator

import pytest

from conftest import REPO_ROOT
from experiments.cluster import shell
from lease_helpers import OUTSIDER_UID, as_user, can_switch_users

SCRIPT = REPO_ROOT / "deploy" / "slurm" / "crossover_tf_ports.sh"
JOB_ID, BLOCK = 7, 10000 + 64 * 7  # the job's 64-port block: 10448-10511
NODE_SIDE, OUTSIDE = "198.19.253.1", "198.19.253.2"  # benchmarking range, unused by the cluster
NETNS_OK, NETNS_REASON = shell.netns_usable()

# Listens on every interface at argv[1] (as TensorFlow's server does), accepting until killed.
LISTEN = """
import socket, sys
s = socket.socket()
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen()
print("LISTENING", flush=True)
while True:
    s.accept()[0].close()
"""
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print("CONNECTED")
except OSError as err:
    print("REFUSED", type(err).__name__)
"""


def _slurm(context: str, **env: str) -> subprocess.CompletedProcess:
    slurm = {"SLURM_SCRIPT_CONTEXT": context, "SLURM_JOB_ID": str(JOB_ID), "SLURM_JOB_UID": "0",
             "SLURM_JOB_NODELIST": "localhost", **env}
    return subprocess.run(["bash", str(SCRIPT)], env={**os.environ, **slurm},
                          capture_output=True, text=True, timeout=60)


def test_the_task_prolog_gives_each_step_its_ports_inside_the_jobs_block():
    bases = [_slurm("prolog_task", SLURM_STEP_ID=str(step)).stdout.strip() for step in (0, 1, 4)]
    assert bases == [f"export CROSSOVER_TF_PORT_BASE={BLOCK}",
                     f"export CROSSOVER_TF_PORT_BASE={BLOCK + 16}",
                     f"export CROSSOVER_TF_PORT_BASE={BLOCK}"]
    refused = _slurm("")
    assert refused.returncode == 2 and "Prolog, Epilog or TaskProlog" in refused.stderr


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def _node_and_outsider() -> Iterator[tuple[str, str]]:
    """Two namespaces joined by a veth pair: a job's node (NODE_SIDE) and a host outside the
    allocation (OUTSIDE). Removed on the way out, rules and all."""
    tag = f"ctfp{os.getpid() % 10000}"
    node, outsider = f"{tag}n", f"{tag}o"
    try:
        for ns in (node, outsider):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", node, "link", "add", f"{tag}a", "type", "veth", "peer", "name", f"{tag}b",
            "netns", outsider)
        for ns, iface, address in ((node, f"{tag}a", NODE_SIDE), (outsider, f"{tag}b", OUTSIDE)):
            _ip("-n", ns, "addr", "add", f"{address}/30", "dev", iface)
            _ip("-n", ns, "link", "set", iface, "up")
        yield node, outsider
    finally:
        for ns in (node, outsider):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _connect(ns: str, address: str, port: int, uid: int = 0) -> str:
    command = ["ip", "netns", "exec", ns, *(as_user(uid, ()) if uid else []),
               sys.executable, "-c", CONNECT, address, str(port)]
    return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.strip()


@contextlib.contextmanager
def _listening(ns: str, port: int) -> Iterator[None]:
    server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", LISTEN,
                               str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "LISTENING"
        yield
    finally:
        server.kill()
        server.wait()


@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.skipif(not NETNS_OK, reason=f"needs root and ip netns: {NETNS_REASON}")
@pytest.mark.skipif(shutil.which("nft") is None, reason="needs nft (Debian's nftables)")
@pytest.mark.skipif(not can_switch_users(), reason="needs root and setpriv")
def test_the_prolog_fences_the_jobs_block_to_its_user_and_nodes():
    rules = _slurm("prolog_slurmd", CROSSOVER_TF_PORTS_DRY_RUN="1")
    assert rules.returncode == 0, rules.stderr
    with _node_and_outsider() as (node, outsider):
        subprocess.run(["ip", "netns", "exec", node, "nft", "-f", "-"], input=rules.stdout,
                       check=True, capture_output=True, text=True, timeout=30)
        with _listening(node, BLOCK), _listening(node, BLOCK + 64):
            assert _connect(node, "127.0.0.1", BLOCK) == "CONNECTED"  # the job's user
            assert _connect(node, "127.0.0.1", BLOCK, OUTSIDER_UID).startswith("REFUSED")
            assert _connect(outsider, NODE_SIDE, BLOCK).startswith("REFUSED")
            # Past the block: nothing of the job's, nothing fenced.
            assert _connect(node, "127.0.0.1", BLOCK + 64, OUTSIDER_UID) == "CONNECTED"
            assert _connect(outsider, NODE_SIDE, BLOCK + 64) == "CONNECTED"
        # The block's port numbers on a host outside the allocation stay free to every user of
        # the node (the fence is for the job's nodes only).
        with _listening(outsider, BLOCK):
            assert _connect(node, OUTSIDE, BLOCK, OUTSIDER_UID) == "CONNECTED"
        subprocess.run(["ip", "netns", "exec", node, "bash", str(SCRIPT)], check=True,
                       timeout=30, env={**os.environ, "SLURM_SCRIPT_CONTEXT": "epilog_slurmd",
                                        "SLURM_JOB_ID": str(JOB_ID)})
        tables = subprocess.run(["ip", "netns", "exec", node, "nft", "list", "tables"],
                                capture_output=True, text=True, timeout=30).stdout
        assert f"crossover_tf_job_{JOB_ID}" not in tables
