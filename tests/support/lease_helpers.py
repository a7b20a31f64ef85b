"""What the lease tests that run real processes share: other uids (setpriv), a group directory,
a bounded wait, and the node exporter run and scraped as an operator would (conftest's lease_cli
fixture builds the core's CLI)."""
from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Callable, Iterator

import pytest

from service import free_port

# Made-up ids with no entry in the user database (as a bare uid from a container runtime):
# two members of the lease group, and an outsider.
GROUP_GID, USER_UIDS, OUTSIDER_UID = 62000, (61001, 61002), 61003


def can_switch_users() -> bool:
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


needs_other_users = pytest.mark.skipif(not can_switch_users(),
                                       reason="needs root and setpriv to run as other uids")


@contextlib.contextmanager
def scratch_base() -> Iterator[pathlib.Path]:
    """A root-owned directory every uid can traverse, removed afterwards."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="crossover-lease-"))
    try:
        base.chmod(0o755)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def group_dir() -> Iterator[pathlib.Path]:
    """A lease directory of group GROUP_GID, mode 3770 (group mode's: setgid, sticky), in a
    scratch base."""
    with scratch_base() as base:
        leases = base / "leases"
        leases.mkdir()
        os.chown(leases, 0, GROUP_GID)
        leases.chmod(0o3770)
        yield leases


def as_user(uid: int, groups: tuple[int, ...], *command: str) -> list[str]:
    """command run as uid (and gid uid) with exactly these supplementary groups."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}",
            "--groups=" + ",".join(map(str, groups)) if groups else "--clear-groups", *command]


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout} s"
        time.sleep(0.02)


# ----- the node exporter ----------------------------------------------------------------------

Samples = dict[tuple[str, frozenset], float]


def scrape(port: int) -> Samples:
    """Every sample the exporter serves, keyed by (name, labels)."""
    from prometheus_client import parser  # the tests that scrape skip without it
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in parser.text_string_to_metric_families(text)
            for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample of name whose labels include these."""
    found = [v for (n, ls), v in samples.items()
             if n == name and set(labels.items()) <= set(ls)]
    assert len(found) == 1, (name, labels, found)
    return found[0]


@contextlib.contextmanager
def exporter(lease_dir: pathlib.Path, env: dict[str, str]) -> Iterator[int]:
    """The exporter as an operator starts it, on a free loopback port; stopped afterwards."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "crossover_tf.lease", "exporter",
                             "--web.listen-address", f"127.0.0.1:{port}",
                             "--lease.dir", str(lease_dir)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        assert "serving http://127.0.0.1:" in line, line + proc.stdout.read()
        yield port
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def real_holder(tmp_path: pathlib.Path, group: str, lease_cli: pathlib.Path,
                env: dict[str, str], base: pathlib.Path | None = None
                ) -> Iterator[tuple[pathlib.Path, dict[str, str], int]]:
    """A sticky world-writable lease directory like /dev/shm (anyone may plant names there)
    with job "real" holding its "dev" lease: yields the directory, the environment that names
    it, and the holder's pid; the holder is killed on the way out. The directory is made in
    base if given (scratch_base: other uids can reach it), else in tmp_path."""
    leases = (base or tmp_path) / "shm"
    leases.mkdir()
    leases.chmod(0o1777)
    env = {**env, "CROSSOVER_LEASE_DIR": str(leases)}
    holder = subprocess.Popen([str(lease_cli), "hold", group, "dev", str(tmp_path / "ready")],
                              env={**env, "CROSSOVER_LEASE_JOB": "real"})
    try:
        wait_for((tmp_path / "ready").exists, 30, "the holder")
        yield leases, env, holder.pid
    finally:
        holder.kill()
        holder.wait()

