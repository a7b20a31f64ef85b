"""A hostile local user on a shared node must not split a pair, stall it or crash it (issue 32).

Each test reproduces one hole a review found in the lease core at 1d680d4, with real uids
(setpriv), a real full tmpfs and a real time namespace, and checks the refusal or the bound that
closes it. What each gave before is in its docstring.
"""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from lease_helpers import (GROUP_GID, OUTSIDER_UID, USER_UIDS, as_user, group_dir,
                           needs_other_users, scratch_base, wait_for)
from crossover_tf import lease as lease_lib
from crossover_tf.lease import membership, segments

NOBODY = 65534  # a user the user database knows, outside the lease group


def _run(command: list[str], env: dict[str, str], timeout: float = 60
         ) -> subprocess.CompletedProcess:
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)


def _env(lease_dir: pathlib.Path, group_mode: bool = False) -> dict[str, str]:
    return {**os.environ, segments.LEASE_DIR_ENV: str(lease_dir),
            segments.SHARED_GROUP_ENV: "1" if group_mode else "0"}


def _can(command: list[str]) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_mount_namespace = pytest.mark.skipif(
    not _can(["unshare", "--mount", "--propagation", "private", "sh", "-c",
              "mount -t tmpfs -o size=64k tmpfs /mnt"]),
    reason="needs root and unshare --mount to mount a small tmpfs")
needs_time_namespace = pytest.mark.skipif(
    not _can(["unshare", "--time", "--monotonic=1000", "true"]),
    reason="needs root and a kernel with time namespaces (unshare --time)")


# ----- 1. nobody checked the lease directory -------------------------------------------------

@needs_other_users
def test_a_directory_another_user_owns_is_refused_and_nothing_is_created(lease_group,
                                                                          lease_cli):
    """Before: the Slurm recipe's `mkdir -p /var/tmp/crossover` let whoever made it first own
    it; that owner renamed job A's live segment away and job B acquired at once (two holders).
    Now a directory another user owns fails the trust rule on open, naming it and the fix."""
    with scratch_base() as base:
        leases = base / "crossover"
        leases.mkdir()
        os.chown(leases, OUTSIDER_UID, OUTSIDER_UID)
        refused = _run([str(lease_cli), "acquire", lease_group, "dev", "1", "/dev/null"],
                       _env(leases))
        assert refused.returncode == 2, refused
        for part in (f"lease directory {leases} fails the lease's trust rule",
                     f"owner uid {OUTSIDER_UID}", "is owned by neither root nor this job's user",
                     "install -d -m 0700", "install -d -m 1777"):
            assert part in refused.stderr, (part, refused.stderr)
        assert list(leases.iterdir()) == [], "a segment was created in a refused directory"


def test_the_join_check_reads_the_segment_it_holds_not_the_name(tmp_path, lease_group,
                                                                 lease_cli):
    """Before: the join check read the segment by name, so a segment swapped in under the name
    with two members of its own passed a jobs=2 check. Now it reads the mapping the job holds,
    and the renamed name is an error (FAILED_PRECONDITION) for the job, never a pass."""
    lease = lease_lib.DeviceLease(lease_group, "dev", lease_dir=tmp_path, job="jobA")
    lease.register()
    assert [m.job for m in lease.members()] == ["jobA"]
    path = segments.segment_path(lease_group, "dev", tmp_path)
    path.rename(tmp_path / "moved-away")
    env = _env(tmp_path)
    # Two jobs of a forged group on a fresh segment under the name: B holds, then C waits
    # (C only once B holds: `acquire` exits as soon as it has the lease).
    forgers = [subprocess.Popen([str(lease_cli), "hold", lease_group, "dev",
                                 str(tmp_path / "ready")], env={**env, "CROSSOVER_LEASE_JOB": "B"})]
    try:
        wait_for((tmp_path / "ready").exists, 30, "forger B")
        forgers.append(subprocess.Popen([str(lease_cli), "acquire", lease_group, "dev", "60",
                                         "/dev/null"], env={**env, "CROSSOVER_LEASE_JOB": "C"}))
        wait_for(lambda: membership.read_snapshot(path).jobs() == {"B", "C"}, 30, "forger C")
        with pytest.raises(tf.errors.FailedPreconditionError, match="renamed, removed or "
                                                                     "replaced"):
            lease.wait_for_jobs(2, timeout_s=5)
        with pytest.raises(tf.errors.FailedPreconditionError, match=str(path)):
            lease.acquire()
    finally:
        for proc in forgers:
            proc.kill()
            proc.wait()


# ----- 2. group mode accepted a file planted by a non-member ----------------------------------

@needs_other_users
def test_group_mode_refuses_a_world_writable_directory_and_a_planted_segment(lease_group,
                                                                             lease_cli):
    """Before: in a world-writable setgid directory (3777) an outsider's file inherited the
    group and 0660 and was accepted; the outsider then cleared the holder word and a second
    member acquired while the first held. Now the directory is refused (writable by others),
    and once it is 3770, the planted file is refused (its owner is outside the group)."""
    with group_dir() as leases:
        leases.chmod(0o3777)
        segment = leases / f"crossover.{lease_group}.dev"
        planted = _run(as_user(NOBODY, (), "sh", "-c", f"umask 0; : > {segment}; "
                               f"chmod 0660 {segment}"), dict(os.environ))
        assert planted.returncode == 0, planted
        st = segment.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (NOBODY, GROUP_GID, 0o660)
        member = as_user(USER_UIDS[0], (GROUP_GID,), str(lease_cli), "acquire", lease_group,
                         "dev", "1", "/dev/null")
        refused = _run(member, _env(leases, group_mode=True))
        assert refused.returncode == 2, refused
        assert "fails the lease's trust rule" in refused.stderr
        assert "is writable by others: in group mode" in refused.stderr, refused.stderr
        leases.chmod(0o3770)
        refused = _run(member, _env(leases, group_mode=True))
        assert refused.returncode == 2, refused
        assert f"{segment} belongs to uid {NOBODY} (nobody), who is not a member" in \
            refused.stderr, refused.stderr
        assert segment.exists(), "a refused segment must not be deleted"


# ----- 3. a full lease directory killed the job with SIGBUS -----------------------------------

@needs_mount_namespace
def test_a_full_lease_directory_is_a_clear_error_and_leaves_nothing(tmp_path, lease_group,
                                                                    lease_cli):
    """Before: ftruncate made a sparse file and the first write into the mapping faulted (exit
    135, no message), and the zero-filled file stayed to crash the next job. Now the blocks are
    allocated first: ENOSPC names the directory and its free space, and no file is left."""
    full = tmp_path / "full"
    full.mkdir(mode=0o700)
    script = (f'mount -t tmpfs -o size=64k,mode=0700 tmpfs {full} && '
              f'(dd if=/dev/zero of={full}/filler bs=4k count=64 2>/dev/null || true) && '
              f'for i in 1 2; do {lease_cli} acquire {lease_group} dev 1 {tmp_path}/out$i; '
              'echo "exit=$?"; done; ls -A ' + str(full))
    shown = _run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                 _env(full))
    assert shown.stdout.count("exit=2") == 2, (shown.stdout, shown.stderr)
    assert shown.stdout.splitlines()[-1] == "filler", shown.stdout  # nothing left behind
    for part in ("cannot allocate", f"segment {full}/crossover.{lease_group}.dev",
                 "No space left on device", f"(lease directory {full}: ", "bytes free"):
        assert part in shown.stderr, (part, shown.stderr)


# ----- 4. any local user could stall `status` ---------------------------------------------

def _planted_with_a_stuck_lock(path: pathlib.Path, size: int) -> None:
    """A 0666 file of a segment's size whose mutex word reads as locked: an old status waited
    its 2 s bound on each such file."""
    data = bytearray(size)
    data[16:20] = (1).to_bytes(4, "little")  # the mutex's lock word, right after the header
    path.write_bytes(bytes(data))
    path.chmod(0o666)


_LEASE_HOLDER = """
import fcntl, os, signal, sys, time
signal.signal(signal.SIGIO, signal.SIG_IGN)  # a lease break must not kill the holder
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK if len(sys.argv) > 2 else fcntl.F_WRLCK)
print("leased", flush=True)
time.sleep(120)
"""


def test_status_cannot_be_stalled_by_planted_files(tmp_path, lease_group, lease_cli,
                                                   child_env):
    """Before: three planted 0666 files with a stuck lock word took 6 s (1,000 would take 33
    minutes), one file held under a write lease blocked the open for 45 s, and names past the
    first 1,000 were dropped silently. Now: the whole command is bounded, every file is opened
    read-only and non-blocking and copied (never locked), files failing the trust rule are
    skipped and named, and the names not shown are counted."""
    leases = tmp_path / "shm"
    leases.mkdir()
    leases.chmod(0o1777)  # like /dev/shm: anyone may create files here
    env = {**_env(leases), **{k: v for k, v in child_env.items() if k == "PYTHONPATH"}}
    holder = subprocess.Popen([str(lease_cli), "hold", lease_group, "dev",
                               str(tmp_path / "ready")], env={**env, "CROSSOVER_LEASE_JOB": "real"})
    lease_holder = None
    try:
        wait_for((tmp_path / "ready").exists, 30, "the real holder")
        real = segments.segment_path(lease_group, "dev", leases)
        stuck = [leases / f"crossover.astuck{i}.dev" for i in range(3)]  # sorted first
        for path in stuck:
            _planted_with_a_stuck_lock(path, real.stat().st_size)
        leased = leases / "crossover.bleased.dev"
        leased.write_bytes(real.read_bytes())
        leased.chmod(0o600)
        lease_holder = subprocess.Popen([sys.executable, "-c", _LEASE_HOLDER, str(leased)],
                                        stdout=subprocess.PIPE, text=True)
        assert lease_holder.stdout.readline().strip() == "leased"
        for i in range(1005):
            (leases / f"crossover.zname{i:04d}.dev").touch()
        start = time.monotonic()
        shown = _run([sys.executable, "-m", "crossover_tf.lease", "status"], env, timeout=120)
        took = time.monotonic() - start
    finally:
        holder.kill()
        holder.wait()
        if lease_holder is not None:
            lease_holder.kill()
            lease_holder.wait()
    assert took < 30, f"status took {took:.1f} s"  # TensorFlow's import is most of it
    assert shown.returncode == 1, shown
    text = shown.stdout
    assert f"lease {real}" in text and "holder: job real" in text, text
    for path in stuck:
        assert f"{path}: " in text and "has permissions 0666" in text, text
    assert f"{leased}: " in text and "holds a file lease on it" in text, text
    # Counted apart from the leases (issue 48, item 5): 3 stuck + 1,005 empty, the first named.
    assert "not leases: 1008 name(s) that fail the trust rule" in text, text
    assert "998 more name(s) not read" in text, text


@needs_mount_namespace
def test_status_needs_no_write_access(tmp_path, lease_group, lease_cli, child_env):
    """Before: status opened each segment read-write, so it could not read a lease through a
    read-only view (and marked a dead locker's mutex consistent, a write). Now it reads
    read-only: a read-only bind mount of a live lease directory lists its holder."""
    leases = tmp_path / "leases"
    leases.mkdir(mode=0o700)
    env = {**_env(leases), "PYTHONPATH": child_env["PYTHONPATH"]}
    holder = subprocess.Popen([str(lease_cli), "hold", lease_group, "dev",
                               str(tmp_path / "ready")], env={**env, "CROSSOVER_LEASE_JOB": "rw"})
    try:
        wait_for((tmp_path / "ready").exists, 30, "the holder")
        view = tmp_path / "view"
        view.mkdir(mode=0o700)
        script = (f"mount --bind {leases} {view} && mount -o remount,bind,ro {view} && "
                  f'exec {sys.executable} -m crossover_tf.lease status --lease_dir {view}')
        shown = _run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                     env, timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert shown.returncode == 0, (shown.stdout, shown.stderr)
    assert "holder: job rw" in shown.stdout, shown.stdout


# ----- 5. a member in a time namespace broke the queue and reservations -----------------------

def _acquired(out: pathlib.Path) -> int:
    """The CLOCK_REALTIME ns at which `lease_cli acquire` got the lease."""
    words = out.read_text().split()
    assert words[0] == "ok", out.read_text()
    return int(words[2])


@needs_time_namespace
def test_a_reservation_made_in_a_time_namespace_expires_for_the_host(tmp_path, lease_group,
                                                                     lease_cli):
    """Before: a primary under `unshare --time --monotonic=100000` reserved the device until a
    time 100000 s ahead of the host's clock, and a peer timed out on a free device ("queued
    behind 0 other waiting thread(s)"). Now reservations are on the host's clock."""
    env = _env(tmp_path)
    primary = subprocess.Popen(["unshare", "--time", "--monotonic=100000", str(lease_cli),
                                "reserve", lease_group, "dev", "0.3", str(tmp_path / "ready")],
                               env=env)
    try:
        wait_for((tmp_path / "ready").exists, 30, "the primary")
        start = time.monotonic()
        taken = _run([str(lease_cli), "acquire", lease_group, "dev", "5",
                      str(tmp_path / "out")], env)
        took = time.monotonic() - start
    finally:
        primary.kill()
        primary.wait()
    assert taken.returncode == 0, taken
    assert (tmp_path / "out").read_text().startswith("ok"), (tmp_path / "out").read_text()
    assert took < 3, f"the reservation held the host's waiter {took:.1f} s"


@needs_time_namespace
def test_a_waiter_in_a_time_namespace_keeps_its_place_in_the_queue(tmp_path, lease_group,
                                                                   lease_cli):
    """Before: a later waiter whose clock ran 100000 s ahead dropped an earlier waiter's ticket
    as expired at every lock (76 times in 1.5 s) and took the device first. Now every ticket's
    deadline is on the host's clock and the queue stays FIFO."""
    env = _env(tmp_path)
    path = segments.segment_path(lease_group, "dev", tmp_path)
    holder = subprocess.Popen([str(lease_cli), "hold", lease_group, "dev",
                               str(tmp_path / "ready")], env=env)
    waiters = []
    try:
        wait_for((tmp_path / "ready").exists, 30, "the holder")
        waiters.append(subprocess.Popen([str(lease_cli), "acquire", lease_group, "dev", "20",
                                         str(tmp_path / "first")], env=env))
        wait_for(lambda: len(membership.read_snapshot(path).queue) == 1, 30, "the first waiter")
        waiters.append(subprocess.Popen(["unshare", "--time", "--monotonic=100000",
                                         str(lease_cli), "acquire", lease_group, "dev", "20",
                                         str(tmp_path / "second")], env=env))
        wait_for(lambda: len(membership.read_snapshot(path).queue) == 2, 30, "the second")
        time.sleep(0.3)  # let the second one lock and repair the queue a few times
        assert len(membership.read_snapshot(path).queue) == 2, "a live waiter's ticket dropped"
        holder.send_signal(signal.SIGKILL)
        for waiter in waiters:
            assert waiter.wait(timeout=60) == 0
    finally:
        for proc in [holder, *waiters]:
            proc.kill()
            proc.wait()
    assert _acquired(tmp_path / "first") < _acquired(tmp_path / "second"), "out of turn"


# ----- 6. the smaller holes --------------------------------------------------------------------

def test_a_planted_segment_held_under_flock_is_refused_at_once(tmp_path, lease_group,
                                                               lease_cli):
    """Before: the flock was taken before the owner check, so a planted 0666 file held under a
    shared flock made a job wait the full 30 s and then report "being created or repaired".
    Now the trust rule comes first."""
    leases = tmp_path / "shm"
    leases.mkdir()
    leases.chmod(0o1777)
    planted = segments.segment_path(lease_group, "dev", leases)
    planted.touch()
    planted.chmod(0o666)
    locker = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; "
                               "f = open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_SH); "
                               "print('locked', flush=True); time.sleep(120)", str(planted)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout.readline().strip() == "locked"
        start = time.monotonic()
        refused = _run([str(lease_cli), "acquire", lease_group, "dev", "1", "/dev/null"],
                       _env(leases))
        took = time.monotonic() - start
    finally:
        locker.kill()
        locker.wait()
    assert refused.returncode == 2 and "has permissions 0666" in refused.stderr, refused
    assert "being created or repaired" not in refused.stderr
    assert took < 5, f"refusing took {took:.1f} s"


@needs_other_users
def test_an_unwritable_directory_says_so(lease_group, lease_cli):
    """Before: "it belongs to another user" when no file existed at all."""
    with scratch_base() as base:
        leases = base / "leases"
        leases.mkdir(mode=0o755)
        refused = _run(as_user(USER_UIDS[0], (), str(lease_cli), "acquire", lease_group, "dev",
                               "1", "/dev/null"), _env(leases))
    assert refused.returncode == 2, refused
    assert f"the lease directory {leases} is not writable by this process (uid " \
           f"{USER_UIDS[0]})" in refused.stderr, refused.stderr
    assert "belongs to another user" not in refused.stderr


@needs_other_users
def test_cleanup_removes_only_this_users_unused_segments(tmp_path, lease_group, lease_cli):
    """Before: remove_group_segments unlinked live segments and other users' segments alike.
    Now only this user's segments with no live member go; a live one is left to its last
    member, which removes it at exit."""
    env = _env(tmp_path)
    live = subprocess.Popen([str(lease_cli), "hold", lease_group, "live",
                             str(tmp_path / "ready")], env=env)
    try:
        wait_for((tmp_path / "ready").exists, 30, "the holder")
        unused = segments.segment_path(lease_group, "unused", tmp_path)
        unused.write_bytes(b"")
        unused.chmod(0o600)
        others = segments.segment_path(lease_group, "others", tmp_path)
        others.write_bytes(b"")
        os.chown(others, NOBODY, NOBODY)
        removed = segments.remove_group_segments([lease_group], tmp_path)
        assert removed == [str(unused)], removed
        assert segments.segment_path(lease_group, "live", tmp_path).exists()
        assert others.exists()
    finally:
        live.terminate()
        live.wait()


def test_leave_gives_the_device_back_when_leaving_the_link_turn_fails():
    """Before: leave (then named release, in _keras/hooks.py) skipped yielding the device when
    leaving the link turn raised, so the peer waited for the device until this process died."""
    from crossover_tf import lease as lease_lib

    calls = []

    class Turn:
        def leave(self):
            calls.append("leave")
            raise RuntimeError("the link turn's segment is gone")

    class Lease:
        def yield_device(self):
            calls.append("yield")

    with pytest.raises(RuntimeError, match="segment is gone"):
        lease_lib.leave(Lease(), Turn())
    assert calls == ["leave", "yield"]


def test_the_file_system_tables_of_python_and_cpp_agree():
    """segments.FILE_SYSTEMS mirrors the core's kFileSystems (ops/core/lease_dir.cc)."""
    import re

    from conftest import REPO_ROOT
    source = (REPO_ROOT / "ops" / "core" / "lease_dir.cc").read_text()
    cpp = {int(magic, 16): (name, local == "true") for magic, name, local in
           re.findall(r'\{(0x[0-9A-Fa-f]+), "([^"]+)", (true|false)\}', source)}
    assert cpp and cpp == segments.FILE_SYSTEMS


_JOIN_WORKER = """
import sys
import crossover_tf
crossover_tf.CrossoverStrategy(sys.argv[1], lease=crossover_tf.LeaseOptions(
    jobs=1, join_timeout_s=5, lease_dir=sys.argv[2]))
print("joined", flush=True)
"""


@pytest.mark.slow
@pytest.mark.multiprocess
def test_an_error_joining_on_one_rank_is_every_ranks_error(tmp_path, lease_group, child_env):
    """Before: the join caught only GroupIncomplete, so any other error on one rank (here rank
    1's segment fails the trust rule) left the other ranks waiting in the allgather. Now every
    rank raises, naming the failed rank and its error."""
    from conftest import horovodrun_command, run_bounded

    leases = tmp_path / "leases"
    leases.mkdir(mode=0o700)
    planted = segments.segment_path(lease_group, "cpu1", leases)
    planted.touch()
    planted.chmod(0o666)
    done = run_bounded(horovodrun_command(2, sys.executable, "-c", _JOIN_WORKER, lease_group,
                                          str(leases)), child_env, timeout=240)
    assert done.returncode != 0, done.stdout[-3000:]
    assert "joined" not in done.stdout, done.stdout[-3000:]
    agreed = "rank(s) 1 of this job could not join the group's lease. Rank 1: " \
             "PermissionDeniedError"
    assert done.stdout.count(agreed) >= 2, done.stdout[-4000:]  # said by both ranks
