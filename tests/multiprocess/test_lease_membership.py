"""Jobs that cannot see each other's lease must fail loudly: the lease directory, membership,
the group's join check, the status command and group mode for several users.

Containers are emulated with namespaces: each job runs in its own mount namespace with a
private tmpfs on /dev/shm (what Docker, two Kubernetes pods or Slurm's job_container/tmpfs give
a job), and a directory of the host stands in for the volume they share.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

from conftest import REPO_ROOT, WORKERS
from lease_helpers import (GROUP_GID, OUTSIDER_UID, USER_UIDS, as_user, group_dir,
                           needs_other_users, wait_for)
from crossover_tf.lease import group_join, segments
from crossover_tf.lease.membership import Member, validate_job

WORKER = str(WORKERS / "lease_worker.py")


# ----- pure parts -----------------------------------------------------------------------------

def test_incomplete_group_message_names_file_jobs_causes_and_fix():
    path = pathlib.Path("/dev/shm/crossover.g.dev")
    message = group_join.group_incomplete_message(
        path, [Member("trainer-a", 41, 4026531836, False)], expected=2, timeout_s=30)
    for part in (str(path), "job 'trainer-a' (pid 41)", "for 2 jobs", "saw 1", "Docker",
                 "--ipc=host", "Kubernetes", "hostPath", "hostIPC", "Slurm",
                 "job_container/tmpfs", "outside the plugin's Dirs", "CROSSOVER_LEASE_DIR=",
                 "lease_dir=", "jobs=1"):
        assert part in message, (part, message)
    assert "saw 0: none" in group_join.group_incomplete_message(path, [], 2, 1)


def test_wait_for_jobs_counts_distinct_labels_and_is_bounded():
    path = pathlib.Path("/x")
    two_procs_one_job = [Member("a", 1, 0, False), Member("a", 2, 0, True)]
    start = time.monotonic()
    with pytest.raises(group_join.GroupIncomplete, match="saw 1"):
        group_join.wait_for_jobs(lambda: two_procs_one_job, path, 2, timeout_s=0.3)
    assert 0.3 <= time.monotonic() - start < 2.0
    arrivals = iter([[Member("a", 1, 0, False)]] * 3 + [[Member("a", 1, 0, False),
                                                          Member("b", 2, 0, False)]])
    assert len(group_join.wait_for_jobs(lambda: next(arrivals), path, 2, 5, poll_s=0.01)) == 2
    assert group_join.wait_for_jobs(lambda: two_procs_one_job, path, 1, 0.05) == two_procs_one_job
    for bad in (0, 65, True, 1.5):
        with pytest.raises(ValueError, match="jobs must be a whole number"):
            group_join.validate_jobs(bad)
    for bad in (0, -1.0, float("inf"), True, "5"):  # one rule, the option's and the poller's
        with pytest.raises(ValueError, match="join_timeout_s must be a positive"):
            group_join.wait_for_jobs(lambda: two_procs_one_job, path, 1, bad)
    assert issubclass(group_join.GroupIncomplete, RuntimeError)


def test_more_jobs_than_declared_is_refused_unless_the_extra_one_leaves():
    """Before: the check asked for at least `jobs`, so a third job under a pair's group name
    carried on silently. Now more jobs than declared for the whole join timeout is
    GroupOverfull, naming them; a job of a previous run that leaves within it is waited out."""
    path = pathlib.Path("/dev/shm/crossover.g.dev")
    three = [Member("a", 1, 0, False), Member("b", 2, 0, False), Member("c", 3, 0, False)]
    start = time.monotonic()
    with pytest.raises(group_join.GroupOverfull) as raised:
        group_join.wait_for_jobs(lambda: three, path, 2, timeout_s=0.3)
    assert 0.3 <= time.monotonic() - start < 2.0
    for part in ("declares 2 job(s)", f"but 3 stayed on lease file {path} for 0.3 s",
                 "job 'c' (pid 3)", "its own group name", "stop the extra job"):
        assert part in str(raised.value), (part, str(raised.value))
    leaving = iter([three] * 3 + [three[:2]])
    assert len(group_join.wait_for_jobs(lambda: next(leaving), path, 2, 5, poll_s=0.01)) == 2
    assert issubclass(group_join.GroupOverfull, RuntimeError)


def test_a_job_waiting_behind_more_jobs_than_declared_says_so_at_once(
        caplog: pytest.LogCaptureFixture):
    """Issue 60: three jobs started on a group of two; one ran alone, the other two waited
    with nothing logged until one left (or GroupOverfull after the 120 s join timeout). Now the
    waiting job logs, before its next poll, which job it is, who is on the lease and why it
    waits; once per crowd, not every poll."""
    path = pathlib.Path("/dev/shm/crossover.g.dev")
    me = os.getpid()  # this process is job 'c'
    three = [Member("a", 1, 0, True), Member("b", 2, 0, False), Member("c", me, 0, False)]
    seen_at_poll: list[str] = []

    def members() -> list[Member]:
        seen_at_poll.append(caplog.text)
        return three if len(seen_at_poll) < 5 else three[1:]

    with caplog.at_level("WARNING"):
        assert len(group_join.wait_for_jobs(members, path, 2, 120, poll_s=0.01)) == 2
    assert "waits" not in seen_at_poll[0]
    warned = seen_at_poll[1]
    for part in (f"job 'c' (pid {me}) waits", f"3 jobs are on lease file {path}",
                 "job 'a' (pid 1)", "declares 2 (LeaseOptions.jobs)", "until one leaves",
                 "120 s", "GroupOverfull", "its own group name"):
        assert part in warned, (part, warned)
    assert len(caplog.records) == 1, caplog.text


def test_job_labels_follow_the_core_rule():
    assert validate_job(None) == "" and validate_job("") == ""
    assert validate_job("host-1.example:123@a_b") == "host-1.example:123@a_b"
    for bad in ("a b", "x" * 65, "a/b", "a\n"):
        with pytest.raises(ValueError, match="job label"):
            validate_job(bad)


def test_lease_dir_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv(segments.LEASE_DIR_ENV, raising=False)
    assert segments.resolve_lease_dir() == pathlib.Path("/dev/shm").resolve()
    shm = pathlib.Path("/dev/shm").resolve()
    assert segments.segment_path("g", "dev") == shm / "crossover.g.dev"
    monkeypatch.setenv(segments.LEASE_DIR_ENV, str(tmp_path))
    assert segments.resolve_lease_dir() == tmp_path.resolve()
    assert segments.resolve_lease_dir("/dev/shm") == pathlib.Path("/dev/shm").resolve()
    monkeypatch.setenv(segments.LEASE_DIR_ENV, str(tmp_path / "absent"))
    with pytest.raises(segments.LeaseDirError, match=r"absent \(from \$CROSSOVER_LEASE_DIR\) "
                                                     "does not exist"):
        segments.resolve_lease_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(segments.LeaseDirError, match="is not a directory"):
        segments.resolve_lease_dir(tmp_path / "file")
    assert issubclass(segments.LeaseDirError, ValueError)


def test_only_file_systems_known_to_be_local_are_accepted(tmp_path, monkeypatch):
    """An allowlist (issue 32): BeeGFS, PanFS and any unknown type are refused as NFS is, each
    named in the refusal."""
    assert segments.file_system_type(pathlib.Path("/dev/shm")) == 0x01021994  # tmpfs
    segments.check_local(tmp_path, 0xEF53)  # ext4: fine
    for magic, kind in ((0x6969, "nfs"), (0xFF534D42, "cifs"), (0x65735546, "fuse"),
                        (0x19830326, "beegfs"), (0x20030528, "panfs"),
                        (0x12345678, "an unknown type")):
        monkeypatch.setattr(segments, "file_system_type", lambda path, m=magic: m)
        with pytest.raises(segments.LeaseDirError) as err:
            segments.resolve_lease_dir(tmp_path)
        message = str(err.value)
        assert str(tmp_path.resolve()) in message and f"on {kind} ({magic:#x})" in message
        assert "not a file system known to be local" in message, message


def test_find_segments_lists_only_lease_files(tmp_path):
    for name in ("crossover.g1.dev", "crossover.g2.gpu0", "crossover.bad", "other.g1.dev",
                 "crossover.g1.a.b"):
        (tmp_path / name).write_text("")
    found = segments.find_segments(tmp_path)
    assert [(s.group, s.device_key) for s in found] == [("g1", "dev"), ("g2", "gpu0")]
    assert [s.group for s in segments.find_segments(tmp_path, "g2")] == ["g2"]
    assert segments.remove_group_segments(["g1"], tmp_path) == [str(tmp_path / "crossover.g1.dev")]


def test_names_planted_to_sort_first_cannot_hide_a_real_lease(tmp_path):
    """Before (issue 48): 1,000 empty files named to sort first made status and the exporter
    show 0 leases, the real one past the first MAX_SEGMENTS names. Names that may be real
    leases (regular, not empty, 0600 or the group's 0660) are listed first."""
    for i in range(segments.MAX_SEGMENTS + 1):
        (tmp_path / f"crossover.a{i:04d}.dev").touch()  # empty: anyone may make these
    loud = tmp_path / "crossover.aaloud.dev"
    loud.write_bytes(b"x" * 64)
    loud.chmod(0o666)  # readable and writable by all: no segment is
    real = tmp_path / "crossover.zreal.dev"
    real.write_bytes(b"\0" * 64)
    real.chmod(0o600)
    listing = segments.scan_segments(tmp_path)
    assert listing.found[0].path == real
    # The others still count: 1,002 that cannot be leases, 999 of them listed (each is read,
    # and named when refused), 3 past the bound counted.
    assert len(listing.found) == segments.MAX_SEGMENTS and listing.not_shown == 3


# ----- the op library in one process ----------------------------------------------------------

def test_lease_in_a_directory_registers_and_lists_members(tmp_path, lease_group, lease_cli):
    from crossover_tf import lease as lease_lib
    lease = lease_lib.DeviceLease(lease_group, "cpu0", lease_dir=tmp_path, job="solo")
    assert lease.path == tmp_path.resolve() / f"crossover.{lease_group}.cpu0"
    assert lease.names["lease_dir"] == str(tmp_path.resolve())
    assert not lease.path.exists()  # nothing is created before the first op
    lease.register()
    lease.register()
    assert (lease.path.stat().st_mode & 0o777) == 0o600
    assert lease.members() == [lease_lib.Member("solo", os.getpid(), lease.members()[0].pid_ns,
                                                False)]
    lease.acquire()
    assert lease.members()[0].holding
    lease.yield_device()
    assert [m.job for m in lease.wait_for_jobs(1, 1.0)] == ["solo"]
    with pytest.raises(lease_lib.GroupIncomplete, match=str(lease.path)):
        lease.wait_for_jobs(2, 0.2)
    others = [subprocess.Popen([str(lease_cli), "hold", lease_group, "cpu0",
                                str(tmp_path / f"ready{job}")],
                               env={**os.environ, segments.LEASE_DIR_ENV: str(tmp_path),
                                    "CROSSOVER_LEASE_JOB": job}) for job in ("B", "C")]
    try:  # two more jobs on a lease declared for two: refused, naming them
        wait_for(lambda: {m.job for m in lease.members()} == {"solo", "B", "C"}, 30,
                 "jobs B and C")
        with pytest.raises(lease_lib.GroupOverfull, match="job 'C'"):
            lease.wait_for_jobs(2, 0.2)
    finally:
        for proc in others:
            proc.kill()
            proc.wait()
    other = lease_lib.DeviceLease(lease_group, "cpu0", lease_dir=tmp_path, job="other")
    with pytest.raises(Exception, match="as job 'solo'"):  # one process is one job
        other.register()


def test_a_member_stays_one_when_tensorflow_drops_its_kernels(tmp_path, lease_group,
                                                               child_env):
    """A job stays on the lease while it lives: tf.random.set_seed (as keras'
    set_random_seed does, right after the strategy joins) clears TensorFlow's eager kernel
    cache, and the lease a dropped kernel held once went with it, so the peer's join check
    saw the job leave while it waited for the peer at the start barrier."""
    code = ("import sys, time, tensorflow as tf\n"
            "from crossover_tf.lease import DeviceLease\n"
            f"lease = DeviceLease({lease_group!r}, 'cpu0', lease_dir={str(tmp_path)!r}, "
            "job='early')\n"
            "lease.register()\n"
            "tf.random.set_seed(0)\n"
            "import gc; gc.collect()\n"
            "print('ready', flush=True)\n"
            "sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], env=child_env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == "ready"
        from crossover_tf.lease.membership import read_snapshot
        path = segments.segment_path(lease_group, "cpu0", tmp_path)
        assert [m.job for m in read_snapshot(path).members] == ["early"]
    finally:
        proc.communicate(timeout=60)


# ----- real processes in their own mount namespaces -------------------------------------------

def _can_make_private_shm() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs tmpfs /dev/shm"], capture_output=True, timeout=30)
    return probe.returncode == 0


needs_private_shm = pytest.mark.skipif(
    not _can_make_private_shm(),
    reason="cannot make a mount namespace with a private /dev/shm here (needs root or "
           "CAP_SYS_ADMIN: unshare --mount + mount -t tmpfs)")


def _in_container(*command: str) -> list[str]:
    """Runs command with a private /dev/shm, as a container or Slurm job would have it."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "sh", *command]


def _holds(out: pathlib.Path, job: int) -> list[tuple[int, int, int]]:
    return [(int(s), int(e), job) for s, e in (line.split() for line in
                                                out.read_text().splitlines())]


def _overlaps(holds: list[tuple[int, int, int]]) -> int:
    ordered = sorted(holds)
    return sum(e1 > s2 for (_, e1, _), (s2, _, _) in zip(ordered, ordered[1:]))


def _cycle_in_containers(tmp_path: pathlib.Path, group: str, env: dict[str, str],
                         cli: pathlib.Path) -> list[tuple[int, int, int]]:
    outs = [tmp_path / f"job{j}.txt" for j in range(2)]
    procs = [subprocess.Popen(_in_container(str(cli), "cycles", group, "dev", "30", "2000",
                                            str(out), str(tmp_path / "barrier"), "2"), env=env)
             for out in outs]
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    return _holds(outs[0], 0) + _holds(outs[1], 1)


@needs_private_shm
@pytest.mark.multiprocess
def test_private_shm_jobs_cross_through_a_shared_lease_dir(tmp_path, lease_group, lease_cli):
    """Without a shared directory the two jobs overlap (the harness really isolates them);
    with CROSSOVER_LEASE_DIR on a shared directory they take turns."""
    for run in ("alone", "shared"):
        (tmp_path / run).mkdir()
    alone = _cycle_in_containers(tmp_path / "alone", lease_group,
                                 {k: v for k, v in os.environ.items()
                                  if k != segments.LEASE_DIR_ENV}, lease_cli)
    assert _overlaps(alone) >= 10, f"private /dev/shm did not isolate: {_overlaps(alone)}"
    shared_dir = tmp_path / "leases"
    shared_dir.mkdir()
    shared = _cycle_in_containers(tmp_path / "shared", lease_group,
                                  {**os.environ, segments.LEASE_DIR_ENV: str(shared_dir)},
                                  lease_cli)
    assert len(shared) == 60 and _overlaps(shared) == 0, _overlaps(shared)
    owners = [j for _, _, j in sorted(shared)]
    assert sum(a != b for a, b in zip(owners, owners[1:])) >= 0.8 * (len(owners) - 1), owners


def _join_in_containers(tmp_path: pathlib.Path, group: str, env: dict[str, str],
                        timeout_s: float) -> list[dict]:
    outs = [tmp_path / f"join{j}.json" for j in range(2)]
    procs = [subprocess.Popen(_in_container(sys.executable, WORKER, "join", group, "cpu0",
                                            f"job{j}", "2", str(timeout_s), str(out)),
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for j, out in enumerate(outs)]
    for proc in procs:
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, out
    return [json.loads(out.read_text()) for out in outs]


@needs_private_shm
@pytest.mark.multiprocess
@pytest.mark.slow
def test_join_check_fails_loudly_without_a_shared_dir_and_passes_with_one(
        tmp_path, lease_group, child_env):
    env = {k: v for k, v in child_env.items() if k != segments.LEASE_DIR_ENV}
    for result in _join_in_containers(tmp_path, lease_group, env, timeout_s=4):
        assert "error" in result, result
        message = result["error"]
        assert result["path"] in message and "for 2 jobs" in message and "saw 1" in message
        assert "CROSSOVER_LEASE_DIR" in message and "Slurm" in message, message
    shared_dir = tmp_path / "leases"
    shared_dir.mkdir()
    env[segments.LEASE_DIR_ENV] = str(shared_dir)
    for result in _join_in_containers(tmp_path, lease_group, env, timeout_s=60):
        assert result.get("jobs") == ["job0", "job1"], result
        assert result["path"].startswith(str(shared_dir.resolve()))


# ----- the status command ---------------------------------------------------------------------

def _status(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crossover_tf.lease", "status", *args],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO_ROOT)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_status_shows_members_holder_and_queue_without_joining(tmp_path, lease_group,
                                                               child_env, lease_cli):
    from crossover_tf import lease as lease_lib
    empty = tmp_path / "empty"
    empty.mkdir()
    none = _status("--lease_dir", str(empty), env=child_env)
    assert none.returncode == 0 and none.stdout.strip() == f"no leases in {empty.resolve()}"
    assert list(empty.iterdir()) == [], "status created something"
    env = {**child_env, segments.LEASE_DIR_ENV: str(tmp_path)}
    ready = tmp_path / "ready"
    holder = subprocess.Popen([str(lease_cli), "hold", lease_group, "dev", str(ready)],
                              env={**env, "CROSSOVER_LEASE_JOB": "holder-job"})
    waiter = None
    try:
        wait_for(ready.exists, 30, "the holder")
        waiter = subprocess.Popen([str(lease_cli), "acquire", lease_group, "dev", "60",
                                   str(tmp_path / "waited")],
                                  env={**env, "CROSSOVER_LEASE_JOB": "waiter-job"})
        path = tmp_path.resolve() / f"crossover.{lease_group}.dev"
        wait_for(lambda: lease_lib.membership.read_snapshot(path).queue, 30, "the waiter")
        shown = _status("--group", lease_group, env=env)
        again = lease_lib.membership.read_snapshot(path)
    finally:
        holder.kill()
        holder.wait()
        if waiter is not None:
            waiter.wait(timeout=30)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    for part in (f"lease {path}", f"group {lease_group}  device dev", "members (2):",
                 f"job holder-job  pid {holder.pid}  pid_ns ", "(holder)",
                 f"job waiter-job  pid {waiter.pid}", f"holder: job holder-job  pid {holder.pid}",
                 "queue (1):", f"1. job waiter-job  pid {waiter.pid}  priority normal  waited"):
        assert part in text, (part, text)
    assert len(again.members) == 2, "status became a member"
    other = _status("--group", "nosuchgroup", env=env)
    assert other.returncode == 0 and "no leases in" in other.stdout


PAIRS = 20


@pytest.mark.multiprocess
def test_pairs_that_end_together_leave_the_lease_directory_empty(tmp_path, lease_group,
                                                                 lease_cli):
    """Issue 48, item 6: once in four clean pair runs a segment was left with no members.
    Two members exiting at once each saw the other's locks (held until its process ended,
    which a TensorFlow process takes its time over) and neither removed the segment; now each
    drops its own locks before the next takes the removal's flock. PAIRS pairs of contenders
    that step together, exit together, and linger 300 ms past the lease's exit handler."""
    leases = tmp_path / "leases"
    leases.mkdir(mode=0o700)
    env = {**os.environ, segments.LEASE_DIR_ENV: str(leases), "LEASE_CLI_EXIT_LINGER_MS": "300"}
    left = []
    for run in range(PAIRS):
        barrier = tmp_path / f"barrier{run}"
        procs = [subprocess.Popen([str(lease_cli), "cycles", lease_group, "dev", "3", "500",
                                   str(tmp_path / f"out{run}_{j}"), str(barrier), "2"],
                                  env=env, stdout=subprocess.DEVNULL)
                 for j in range(2)]
        assert [proc.wait(timeout=60) for proc in procs] == [0, 0]
        if any(leases.iterdir()):
            left.append(run)
            for path in leases.iterdir():
                path.unlink()
    assert not left, f"{len(left)} of {PAIRS} clean pairs left their segment: runs {left}"


# ----- group mode: several users --------------------------------------------------------------

@needs_other_users
@pytest.mark.multiprocess
def test_two_users_of_one_group_share_a_lease_and_an_outsider_is_refused(lease_group,
                                                                         lease_cli):
    assert os.stat(lease_cli).st_mode & 0o005 == 0o005, "lease_cli must be runnable by others"
    with group_dir() as leases:
        env = {**os.environ, segments.LEASE_DIR_ENV: str(leases),
               "CROSSOVER_LEASE_SHARED_GROUP": "1"}
        outs = [leases / f"job{j}.txt" for j in range(2)]
        (leases / "barrier").mkdir(mode=0o777)
        (leases / "barrier").chmod(0o777)  # both uids check in there
        procs = [subprocess.Popen(as_user(uid, (GROUP_GID,), str(lease_cli), "cycles", lease_group,
                                           "dev", "30", "2000", str(out), str(leases / "barrier"),
                                           "2"), env=env)
                 for uid, out in zip(USER_UIDS, outs)]
        for proc in procs:
            assert proc.wait(timeout=120) == 0
        holds = _holds(outs[0], 0) + _holds(outs[1], 1)
        assert len(holds) == 60 and _overlaps(holds) == 0, _overlaps(holds)
        segment = leases / f"crossover.{lease_group}.dev"
        # The last member out removes the segment where it may: in the sticky group directory
        # (3770) only the segment's creator can, so one made by the other user stays, unused,
        # and the next job reuses it.
        leftover = segment.stat() if segment.exists() else None
        assert leftover is None or leftover.st_uid in USER_UIDS, leftover
        ready = leases / "ready"
        holder = subprocess.Popen(as_user(USER_UIDS[0], (GROUP_GID,), str(lease_cli), "hold",
                                           lease_group, "dev", str(ready)), env=env)
        try:
            wait_for(ready.exists, 30, "the holder")
            st = segment.stat()
            creator = USER_UIDS[0] if leftover is None else leftover.st_uid
            assert (st.st_mode & 0o7777, st.st_gid, st.st_uid) == (0o660, GROUP_GID, creator)
            refused = subprocess.run(as_user(OUTSIDER_UID, (), str(lease_cli), "acquire",
                                              lease_group, "dev", "1", "/dev/null"),
                                     env=env, capture_output=True, text=True, timeout=60)
        finally:
            holder.kill()
            holder.wait()
        assert refused.returncode == 2, refused
        assert f"lease directory {leases} fails the lease's trust rule" in refused.stderr
        assert f"member of the group of the lease directory {leases} (gid {GROUP_GID})" in \
            refused.stderr, refused.stderr
        assert segment.exists(), "a refused segment must not be deleted"


def test_group_mode_follows_its_environment_variable_unless_given(monkeypatch):
    """A batch script or container spec sets group mode for every job, as it sets the lease
    directory (deploy/README.md)."""
    monkeypatch.delenv(segments.SHARED_GROUP_ENV, raising=False)
    assert segments.resolve_shared_group() is False
    monkeypatch.setenv(segments.SHARED_GROUP_ENV, "1")
    assert segments.resolve_shared_group() is True
    assert segments.resolve_shared_group(False) is False
    monkeypatch.setenv(segments.SHARED_GROUP_ENV, "yes")
    with pytest.raises(ValueError, match="must be 0 or 1"):
        segments.resolve_shared_group()
