"""Another local user must not run code through the op library's cache, truncate a file through
it or stall a first use on it (issue 59, items 1-3 and install.sh's Horovod wheel cache).

Each test plays the review's attacker with a real other uid (setpriv) against a root victim
(this process, or a child of it). What each gave before is in its docstring.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import subprocess
import sys
import time

import pytest

from lease_helpers import (GROUP_GID, OUTSIDER_UID, USER_UIDS, as_user, needs_other_users,
                           scratch_base, wait_for)
from op_cache_fakes import copy_sources, fake_make, run_count
from crossover_tf.lease import op_cache

pytestmark = pytest.mark.multiprocess
TF = "9.9.9"
VICTIM = """
import pathlib, sys
from crossover_tf.lease import op_cache
op_cache.cached_library(sys.argv[1], pathlib.Path(sys.argv[2]), root=pathlib.Path(sys.argv[3]))
"""


@pytest.fixture
def sources(tmp_path: pathlib.Path) -> pathlib.Path:
    return copy_sources(tmp_path / "op_sources")


@pytest.fixture
def base() -> pathlib.Path:
    """A root-owned folder like /tmp (sticky, anyone may create names in it)."""
    with scratch_base() as folder:
        folder.chmod(0o1777)
        yield folder


def _as_outsider(script: str) -> None:
    done = subprocess.run(as_user(OUTSIDER_UID, (), "sh", "-c", script), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done


def _refused(sources: pathlib.Path, root: pathlib.Path) -> str:
    with pytest.raises(op_cache.OpBuildError) as err:
        op_cache.cached_library(TF, sources, root=root)
    return str(err.value)


@needs_other_users
def test_a_library_planted_in_a_cache_another_user_made_is_never_loaded(
        sources, base, tmp_path, monkeypatch):
    """Before: with XDG_CACHE_HOME under /tmp, the attacker made the cache folder first and put
    a library at the predictable key; the victim's first use returned it to be loaded. Now the
    folder fails the trust rule (its owner), whatever it holds, and nothing is built or read."""
    runs = fake_make(tmp_path, monkeypatch)
    root = op_cache.cache_root({"XDG_CACHE_HOME": str(base / "xdg")})
    entry = root / op_cache.build_key(TF, sources)
    evil = b"attacker's code\n"
    _as_outsider(f"mkdir -p {entry} && printf \"attacker's code\\n\" > {entry}/_lease_ops.so && "
                 f"echo '{{\"tensorflow\": \"{TF}\"}}' > {entry}/_lease_ops.build.json && "
                 f"echo {hashlib.sha256(evil).hexdigest()} > "
                 f"{entry}/{getattr(op_cache, 'DIGEST_NAME', '_lease_ops.sha256')}")
    message = _refused(sources, root)
    assert f"op library cache {root} fails the trust rule" in message
    assert f"{base / 'xdg'} (owner uid {OUTSIDER_UID}, mode 0755) is owned by neither root " \
           "nor this user" in message
    assert "set CROSSOVER_CACHE to one made with `install -d -m 0700 DIR`" in message
    assert run_count(runs) == 0


@needs_other_users
@pytest.mark.parametrize("folder", ["the attacker's", "a sticky shared"])
def test_a_lock_link_planted_in_the_cache_truncates_nothing(sources, base, tmp_path,
                                                            monkeypatch, folder):
    """Before: the attacker linked <key>.lock to a root-only file; the root job's open followed
    the link, truncated the file and wrote its pid into it. Now an attacker's folder is refused
    before anything in it is opened, and in a sticky folder both may write (root's 1777 cache)
    the lock is opened with O_NOFOLLOW and the link refused."""
    runs = fake_make(tmp_path, monkeypatch)
    secret = base / "root-only"
    secret.write_text("root's secret\n")
    secret.chmod(0o600)
    cache = base / "cache"
    if folder == "a sticky shared":
        cache.mkdir(mode=0o755)
        cache.chmod(0o1777)
    lock = cache / f"{op_cache.build_key(TF, sources)}.lock"
    _as_outsider(f"mkdir -p {cache} && ln -s {secret} {lock}")
    message = _refused(sources, cache)
    assert str(cache) in message and "CROSSOVER_CACHE" in message, message
    if folder == "a sticky shared":
        assert f"{lock} is a symbolic link" in message, message
    assert secret.read_text() == "root's secret\n" and run_count(runs) == 0


@needs_other_users
@pytest.mark.parametrize("lock_owner", ["the attacker", "the victim (a 0644 lock from before)"])
def test_a_lock_another_user_holds_is_refused_at_once_naming_its_real_holder(
        sources, base, tmp_path, monkeypatch, child_env, lock_owner):
    """Before: in a shared cache another user held the lock (their own <key>.lock, or the
    victim's 0644 one opened read-only) and the first use waited 900 s, then named the pid the
    attacker wrote in the file. Now the attacker's lock is refused by its owner, and a lock of
    the victim's held by another uid is refused at once, naming the holder the kernel reports."""
    fake_make(tmp_path, monkeypatch)
    cache = base / "shared"
    cache.mkdir()
    cache.chmod(0o1777)
    lock, ready = cache / f"{op_cache.build_key(TF, sources)}.lock", base / "ready"
    if lock_owner != "the attacker":
        lock.write_text("")
        lock.chmod(0o644)
    plant = "echo 1 > {lock}; " if lock_owner == "the attacker" else ""
    holder = subprocess.Popen(as_user(OUTSIDER_UID, (), "sh", "-c",
                                      f"{plant.format(lock=lock)}exec flock -x {lock} "
                                      f"sh -c 'touch {ready}; sleep 120'"))
    try:
        wait_for(ready.exists, 30, "the attacker's lock")
        start = time.monotonic()
        victim = subprocess.run([sys.executable, "-c", VICTIM, TF, str(sources), str(cache)],
                                env={**child_env, "PATH": os.environ["PATH"]},
                                capture_output=True, text=True, timeout=120)
        assert time.monotonic() - start < 60, "the victim waited on the attacker's lock"
    finally:
        holder.kill()
        holder.wait()
    assert victim.returncode != 0 and "OpBuildError" in victim.stderr, victim.stderr
    assert str(lock) in victim.stderr and "pid 1)" not in victim.stderr, victim.stderr
    if lock_owner == "the attacker":
        assert f"owner uid {OUTSIDER_UID}" in victim.stderr, victim.stderr
    else:
        assert f"held by process {holder.pid} of uid {OUTSIDER_UID}" in victim.stderr, \
            victim.stderr


@needs_other_users
def test_a_link_another_user_owns_on_the_cache_path_is_not_followed(sources, base, tmp_path,
                                                                     monkeypatch):
    """Before: CROSSOVER_CACHE naming an attacker's link under /tmp was followed wherever it
    pointed, now or between two ranks' uses. Now such a link is refused, whatever its target
    (here the victim's own, valid cache), as the lease directory's walk refuses it."""
    runs = fake_make(tmp_path, monkeypatch)
    own = base / "own"
    library = op_cache.cached_library(TF, sources, root=own / "ops")
    link = base / "link"
    _as_outsider(f"ln -s {own} {link}")
    message = _refused(sources, link / "ops")
    assert f"{link} is a symbolic link owned by uid {OUTSIDER_UID}" in message
    assert op_cache.cached_library(TF, sources, root=own / "ops") == library
    assert run_count(runs) == 1


@needs_other_users
def test_a_cache_folder_shared_with_a_group_is_refused(sources, tmp_path, monkeypatch):
    """Before: a cache folder shared by the members of a group (2775) was used as it was; a
    member who made ops/ in it first owned every entry the others then loaded. Now the folder
    fails the trust rule (group-writable, not sticky) and nothing is made in it."""
    runs = fake_make(tmp_path, monkeypatch)
    with scratch_base() as folder:
        shared = folder / "shared"
        shared.mkdir()
        os.chown(shared, 0, GROUP_GID)
        shared.chmod(0o2775)
        member = subprocess.run(as_user(USER_UIDS[0], (GROUP_GID,), "mkdir", str(shared / "ops")),
                                capture_output=True, text=True, timeout=60)
        assert member.returncode == 0, member
        message = _refused(sources, shared / "ops")
        assert f"{shared} (owner uid 0 (root), mode 2775) is writable by its group" in message
        assert sorted(p.name for p in shared.iterdir()) == ["ops"]
        assert list((shared / "ops").iterdir()) == [] and run_count(runs) == 0


def _check_wheels(folder: pathlib.Path, child_env: dict[str, str]) -> subprocess.CompletedProcess:
    """scripts/install.sh's check of its Horovod wheel folder, as the script runs it."""
    return subprocess.run([sys.executable, "-m", "crossover_tf.lease.trusted_path", str(folder)],
                          env=child_env, capture_output=True, text=True, timeout=60)


@needs_other_users
def test_install_sh_refuses_a_horovod_wheel_another_user_could_have_made(base, child_env):
    """Before: install.sh installed any horovod-*.whl it found in $CACHE/wheels/<name>/, which
    under a CROSSOVER_CACHE or HOME in /tmp another user could make first. Now the folder and
    every wheel must be root's or this user's, writable by nobody else; a fresh cache of one's
    own passes (and is made)."""
    wheels = base / "cache" / "wheels" / "horovod-0.28.1-tensorflow-cpu-2.21.0-cp311"
    _as_outsider(f"mkdir -p {wheels} && : > {wheels}/horovod-0.28.1-cp311-linux_x86_64.whl")
    refused = _check_wheels(wheels, child_env)
    assert refused.returncode == 2, refused
    assert f"the Horovod wheel cache {wheels} fails the trust rule" in refused.stderr
    assert f"{base / 'cache'} (owner uid {OUTSIDER_UID}" in refused.stderr, refused.stderr
    own = base / "own" / "wheels" / wheels.name
    assert _check_wheels(own, child_env).returncode == 0 and own.parent.is_dir()
    own.mkdir()
    planted = own / "horovod-0.28.1-cp311-linux_x86_64.whl"
    planted.write_bytes(b"")
    os.chown(planted, OUTSIDER_UID, OUTSIDER_UID)
    refused = _check_wheels(own, child_env)
    assert refused.returncode == 2 and f"{planted} (owner uid {OUTSIDER_UID}" in refused.stderr
    os.chown(planted, 0, 0)
    assert _check_wheels(own, child_env).returncode == 0


def test_install_sh_checks_its_wheel_folder_before_it_looks_in_it():
    """The check above is what scripts/install.sh runs (the script itself is never run here:
    minutes of Horovod build); before: it looked for a wheel and installed it unchecked."""
    script = (pathlib.Path(__file__).parents[2] / "scripts" / "install.sh").read_text()
    check = script.find('-m crossover_tf.lease.trusted_path "$WHEEL_DIR"')
    assert 0 < check < script.find('ls "$WHEEL_DIR"/horovod-*.whl'), \
        "install.sh must check $WHEEL_DIR before it looks for a wheel there"
