"""A real one-node Slurm for the deployment tests, and the hold arithmetic they assert with.

SlurmCluster starts Debian's slurm-wlm (installed by scripts/install_slurm.sh) the way
/work/shared/platform-notes.md found it working here: its own munged (as user munge, with a
fresh key and a private socket), then slurmctld and slurmd as root, in the foreground, each
started here and stopped here by pid. Everything it writes lives in one directory under
/var/tmp (outside job_container/tmpfs's Dirs=/tmp,/dev/shm, so jobs see it too), removed on
stop. The daemons talk over 127.0.0.1 on two free ports; JobContainerType=job_container/tmpfs
is on (PrologFlags=Contain, job_container.conf AutoBasePath/BasePath): every job gets a private
/tmp and /dev/shm, as on a real cluster. No cgroup plugin is used (proctrack/linuxproc,
task/none), so it runs in a container without a cgroup delegation.

A checkout or venv under /tmp (or /dev/shm), where a fresh clone often lives, is hidden from
the jobs by that private /tmp (Slurm 22.05's plugin has no Dirs setting). The cluster then
bind-mounts it, read-only, under its own directory (expose(); the test runs as root) and the
jobs run from there: cluster.root is the checkout and cluster.python the venv's interpreter as
the jobs see them. stop() unmounts them before it removes anything, and removes nothing while a
mount is left.

Where Slurm is missing or does not start, SlurmUnavailable says why (the exact error and the
daemons' log tails); running_cluster(), the body of the tests' fixture, turns that into a
skip.

    with SlurmCluster() as cluster:
        job = cluster.sbatch(["--mem=2G", "--wrap", "hostname"], env=os.environ)
        cluster.wait([job], timeout_s=60)
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import pwd
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np
import pytest

from service import StartStopContext, free_port, log_tail, terminate

from conftest import REPO_ROOT

BASE_ROOT = pathlib.Path(os.environ.get("CROSSOVER_SLURM_BASE", "/var/tmp"))
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "scancel", "setpriv")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


class SlurmUnavailable(RuntimeError):
    """Slurm cannot be installed or started here; the message is the exact reason."""


# --- holds: pure functions over lease timelines ---------------------------------------------

def holds(events: Sequence[Sequence[int]] | np.ndarray) -> list[tuple[int, int]]:
    """(acquired_ns, yielded_ns) of each completed hold of a lease timeline
    ([request, acquired, released, tag] rows, as in stats.json's lease_events_ns)."""
    rows = np.asarray(events, dtype=np.int64).reshape(-1, 4)
    return [(int(a), int(r)) for _, a, r, _ in rows if a and r]


def overlapping_holds(events_by_job: Mapping[str, Sequence[Sequence[int]] | np.ndarray]
                      ) -> dict[str, int]:
    """How the jobs' holds of one device overlapped: the number of holds in all, the number of
    holds that overlap a hold of another job ("overlapped", 0 when the lease works), and the
    number of such overlapping pairs ("pairs")."""
    tagged = sorted((start, end, job) for job, events in events_by_job.items()
                    for start, end in holds(events))
    overlapped: set[int] = set()
    pairs = 0
    for i, (start, end, job) in enumerate(tagged):
        for j in range(i + 1, len(tagged)):
            other_start, _, other_job = tagged[j]
            if other_start >= end:
                break  # sorted by start: no later hold begins before this one ends
            if other_job != job:
                pairs += 1
                overlapped.update((i, j))
    return {"holds": len(tagged), "overlapped": len(overlapped), "pairs": pairs}


def handoffs(events_by_job: Mapping[str, Sequence[Sequence[int]] | np.ndarray]) -> int:
    """How many times the device went from one job's hold to another job's (holds ordered by
    when they were acquired): > 0 when the jobs' lease events alternate."""
    owners = [job for _, job in sorted((start, job) for job, events in events_by_job.items()
                                       for start, _ in holds(events))]
    return sum(1 for a, b in zip(owners, owners[1:]) if a != b)


# --- the jobs the deployment tests run --------------------------------------------------------

STEPS = 40
# Hand-offs between two crossing jobs of STEPS steps each, at the least: the lease events
# alternate (about 40 were seen on 2 busy cores; two jobs with no lease between them interleave
# too, so the tests also check that each job's own lease counted hand-offs).
MIN_HANDOFFS = 10


def train_command(job: str, group: str, model_dir: pathlib.Path, barrier: pathlib.Path,
                  join_flags: bool = True, join_timeout_s: float = 120.0,
                  *extra: str, processes: int = 2, python: str = sys.executable) -> list[str]:
    """One small crossing job (one rank unless its launch starts more), its stats in
    <model_dir>/<job>/stats.json; processes: how many, over both jobs, the barrier waits for;
    python: the interpreter as the job sees it (a Slurm cluster's cluster.python)."""
    command = [python, "-m", "experiments.train", f"--job={job}", f"--group={group}",
               "--model=small_cnn", f"--steps={STEPS}", "--warmup_steps=2",
               "--global_batch_size=16", "--jit_compile=false", "--threads=1",
               f"--model_dir={model_dir}", f"--start_barrier={barrier}:{processes}", *extra]
    if join_flags:  # the join check (issue 21): how many jobs the group has, how long to wait
        command += ["--group_jobs=2", f"--join_timeout_s={join_timeout_s:g}"]
    return command


def job_env(root: pathlib.Path, lease_dir: pathlib.Path | None) -> dict[str, str]:
    """The jobs' environment: root importable, no CROSSOVER_LEASE* from outside, and
    CROSSOVER_LEASE_DIR=lease_dir when given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSOVER_LEASE")}
    env["PYTHONPATH"] = str(root)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if lease_dir is not None:
        env["CROSSOVER_LEASE_DIR"] = str(lease_dir)
    return env


def describe(result: dict) -> str:
    """One line per job and the overlap numbers: what the tests print (and the note quotes)."""
    lines = [f"group {result['group']}, lease directory {result['lease_dir']}"]
    for job, v in result["jobs"].items():
        lease = v["lease"] or {}
        lines.append(f"  job {job} (slurm {v['id']}): {v['state']} exit {v['exit']} in "
                     f"{v['wall_s']} s, device {v['device_key']}, holds {count_holds(v)}, "
                     f"the lease's own count of hand-offs {lease.get('handoffs')} and "
                     f"contended acquires {lease.get('contended')}")
    return "\n".join(lines + describe_overlap(result))


def count_holds(job: dict) -> int | None:
    """A job's complete holds in its lease timeline (None: it wrote no timeline)."""
    events = job["events"]
    return None if events is None else sum(1 for e in events if e[1] and e[2])


def describe_overlap(result: dict) -> list[str]:
    """The overlap line of describe() (none when no job wrote a timeline)."""
    if result["overlap"] is None:
        return []
    o = result["overlap"]
    return [f"  holds {o['holds']}, overlapping another job's hold: {o['overlapped']}"
            f" ({o['pairs']} pairs), hand-offs between the jobs: {result['handoffs']}"]


# --- the cluster ----------------------------------------------------------------------------

def _mem_total_mb() -> int:
    for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise SlurmUnavailable("no MemTotal in /proc/meminfo")


class SlurmCluster(StartStopContext):
    """One node (this host, `hostname`) with slurmctld, slurmd and munged, for the tests."""

    def __init__(self, base_root: pathlib.Path = BASE_ROOT) -> None:
        self.base = pathlib.Path(base_root) / f"crossover-slurm-{uuid.uuid4().hex[:10]}"
        # The checkout and the interpreter as the jobs see them (expose_checkout() moves them
        # out of a private /tmp), and the read-only bind mounts that do it: (source, point).
        self.root = REPO_ROOT
        self.python = sys.executable
        self.exposed: list[tuple[pathlib.Path, pathlib.Path]] = []
        self.node = socket.gethostname()
        self.cpus = os.cpu_count() or 1
        self.conf = self.base / "etc" / "slurm.conf"
        self.munge_socket = self.base / "munge" / "munge.socket.2"
        self.procs: dict[str, subprocess.Popen] = {}
        self.submitted: list[str] = []

    # -- environment for the client commands (sbatch, scontrol, ...)
    def client_env(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        out = dict(os.environ if env is None else env)
        out["SLURM_CONF"] = str(self.conf)
        return out

    def run(self, args: Sequence[str], timeout_s: float = 30.0,
            env: Mapping[str, str] | None = None, check: bool = True
            ) -> subprocess.CompletedProcess:
        result = subprocess.run(list(args), env=self.client_env(env), capture_output=True,
                                text=True, timeout=timeout_s)
        if check and result.returncode:
            raise RuntimeError(f"{' '.join(args)} exited {result.returncode}: "
                               f"{result.stderr.strip() or result.stdout.strip()}")
        return result

    # -- start / stop (StartStopContext makes `with` of them)
    def start(self) -> None:
        missing = [name for name in DAEMONS if shutil.which(name) is None]
        if missing:
            raise SlurmUnavailable(f"not installed: {', '.join(missing)} (scripts/"
                                   f"install_slurm.sh installs Debian's slurm-wlm and munge)")
        if os.geteuid() != 0:
            raise SlurmUnavailable(f"slurmctld/slurmd run as root here; uid is {os.geteuid()}")
        try:
            munge_user = pwd.getpwnam("munge")
        except KeyError:
            raise SlurmUnavailable("no user 'munge' (the munge package creates it)") from None
        for sub in ("etc", "state", "spool", "log", "jobcontainer", "jobs"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        self._start_munged(munge_user)
        self._write_config()
        log = self.base / "log"
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)],
                    log / "slurmctld.out")
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node],
                    log / "slurmd.out")
        self._wait_idle()

    def _spawn(self, name: str, cmd: list[str], out: pathlib.Path) -> None:
        with open(out, "ab") as sink:
            self.procs[name] = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT,
                                                env=self.client_env(), start_new_session=True)

    def _start_munged(self, user: pwd.struct_passwd) -> None:
        mdir = self.munge_socket.parent
        mdir.mkdir()
        mdir.chmod(0o755)  # munged: the socket directory must be searchable by all
        key = mdir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for path in (mdir, key):
            os.chown(path, user.pw_uid, user.pw_gid)
        self._spawn("munged", [
            "setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups",
            "munged", "--foreground", f"--socket={self.munge_socket}", f"--key-file={key}",
            f"--pid-file={mdir / 'munged.pid'}", f"--log-file={mdir / 'munged.log'}",
            f"--seed-file={mdir / 'munged.seed'}"], self.base / "log" / "munged.out")
        deadline = time.monotonic() + 15.0
        while not self.munge_socket.exists():
            if self.procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise SlurmUnavailable(
                    f"munged did not start (exit {self.procs['munged'].poll()}): "
                    f"{log_tail(self.base / 'log' / 'munged.out')} {log_tail(mdir / 'munged.log')}")
            time.sleep(0.1)

    def _write_config(self) -> None:
        etc, base = self.conf.parent, self.base
        real_mb = max(1024, _mem_total_mb() * 3 // 4)
        self.conf.write_text("\n".join([
            f"ClusterName=xo{uuid.uuid4().hex[:8]}",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={base / 'state'}",
            f"SlurmdSpoolDir={base / 'spool'}",
            f"SlurmctldPidFile={base / 'slurmctld.pid'}",
            f"SlurmdPidFile={base / 'slurmd.pid'}",
            f"SlurmctldLogFile={base / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={base / 'log' / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # No cgroups: a container here has no cgroup delegation.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            # What a real cluster gives each job: a private /tmp and /dev/shm.
            "JobContainerType=job_container/tmpfs",
            "PrologFlags=Contain",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            "InactiveLimit=0",
            "KillWait=5",
            "MinJobAge=3600",
            f"NodeName={self.node} NodeAddr=127.0.0.1 NodeHostname={self.node} "
            f"CPUs={self.cpus} RealMemory={real_mb} State=UNKNOWN",
            f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
            ""]))
        (etc / "job_container.conf").write_text(
            f"AutoBasePath=true\nBasePath={base / 'jobcontainer'}\n")

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        state = ""
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise SlurmUnavailable(f"{name} exited {proc.returncode}: "
                                           f"{self.logs(name)}")
            try:
                result = self.run(["sinfo", "-h", "-N", "-o", "%T"], timeout_s=10, check=False)
                state = (result.stdout or result.stderr).strip()
            except subprocess.TimeoutExpired:
                state = "sinfo timed out"
            if state == "idle":
                return
            time.sleep(0.5)
        raise SlurmUnavailable(f"node {self.node} not idle within {START_TIMEOUT_S:.0f} s "
                               f"(sinfo: {state!r}): {self.logs()}")

    def logs(self, name: str | None = None) -> str:
        names = [name] if name else ["slurmctld", "slurmd"]
        return "\n".join(f"--- {n}.log:\n{log_tail(self.base / 'log' / f'{n}.log')}\n"
                         f"--- {n}.out:\n{log_tail(self.base / 'log' / f'{n}.out')}"
                         for n in names)

    # -- what the jobs can see
    def expose(self, path: pathlib.Path) -> pathlib.Path:
        """path as this cluster's jobs reach it: itself where they see it, else through a
        read-only bind mount of it under the cluster's directory (/var/tmp: outside the jobs'
        private /tmp and /dev/shm), made once; a path under an exposed one maps through it.
        Raises SlurmUnavailable, with mount's words, where the mount fails."""
        path = pathlib.Path(os.path.abspath(path))
        for source, point in self.exposed:
            if path.is_relative_to(source):
                return point / path.relative_to(source)
        if not _hidden(path):
            return path
        point = self.base / "exposed" / f"{len(self.exposed)}-{path.name}"
        if path.is_dir():
            point.mkdir(parents=True)
        else:
            point.parent.mkdir(parents=True, exist_ok=True)
            point.touch()
        # Read-only (mount binds, then remounts the bind ro): neither a job nor a removal of the
        # cluster's directory can change the clone through it.
        args = ["mount", "--bind", "-o", "ro", str(path.resolve()), str(point)]
        done = subprocess.run(args, capture_output=True, text=True, timeout=30)
        if done.returncode:
            raise SlurmUnavailable(f"{path} is hidden from the jobs (job_container/tmpfs gives "
                                   f"each a private /tmp and /dev/shm) and `{' '.join(args)}` "
                                   f"failed: {done.stderr.strip()}")
        self.exposed.append((path, point))
        if not _read_only(point):
            raise SlurmUnavailable(f"the bind mount of {path} at {point} is not read-only")
        return point

    def expose_checkout(self) -> None:
        """The checkout (root) and this interpreter's venv (python) where the jobs see them."""
        self.root = self.expose(REPO_ROOT)
        self.expose(pathlib.Path(sys.prefix))
        self.python = str(self.expose(pathlib.Path(sys.executable)))

    def stop(self) -> None:
        """Cancels this cluster's jobs (bounded wait), stops its daemons by pid, unmounts what
        expose() mounted and what job_container/tmpfs may have left mounted (lazily), and then
        removes its directory, unless a mount is still there (it says which)."""
        if self.submitted and "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                self.run(["scancel", *self.submitted], timeout_s=15, check=False)
                self.wait(self.submitted, timeout_s=30, raise_on_timeout=False)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                terminate(proc, STOP_TIMEOUT_S)
        for _, point in reversed(self.exposed):
            subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=15)
        self.exposed.clear()
        if self.base.exists():
            for mount in self._mounts_under(self.base):
                subprocess.run(["umount", "-l", mount], capture_output=True, timeout=15)
            left = self._mounts_under(self.base)
            if left:  # never remove through a mount: an exposed one is someone's checkout
                raise RuntimeError(f"not removing {self.base}: still mounted there: {left}")
            shutil.rmtree(self.base, ignore_errors=True)

    @staticmethod
    def _mounts_under(base: pathlib.Path) -> list[str]:
        points = []
        with contextlib.suppress(OSError):
            for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
                point = line.split()[4].replace("\\040", " ")
                if point == str(base) or point.startswith(f"{base}/"):
                    points.append(point)
        return sorted(points, key=len, reverse=True)

    # -- jobs
    def sbatch(self, args: Sequence[str], env: Mapping[str, str] | None = None) -> str:
        """Submits a batch job (output to <base>/jobs/<id>.out unless args say otherwise);
        returns its id."""
        result = self.run(["sbatch", "--parsable",
                           f"--output={self.base / 'jobs' / '%j.out'}", *args], env=env)
        job_id = result.stdout.strip().split(";")[0]
        self.submitted.append(job_id)
        return job_id

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, ExitCode, NodeList, ...)."""
        out = self.run(["scontrol", "-o", "show", "job", job_id], timeout_s=15).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def output(self, job_id: str) -> str:
        path = self.base / "jobs" / f"{job_id}.out"
        return path.read_text(errors="replace") if path.exists() else f"(no {path})"

    def wait(self, job_ids: Iterable[str], timeout_s: float, raise_on_timeout: bool = True
             ) -> dict[str, dict[str, str]]:
        """Waits (bounded) until every job has finished; returns each one's record."""
        job_ids = list(job_ids)
        deadline = time.monotonic() + timeout_s
        records: dict[str, dict[str, str]] = {}
        while True:
            records = {j: self.job(j) for j in job_ids}
            if all(r.get("JobState") in FINISHED for r in records.values()):
                return records
            if time.monotonic() > deadline:
                if raise_on_timeout:
                    raise TimeoutError(f"jobs not finished within {timeout_s} s: "
                                       f"{ {j: r.get('JobState') for j, r in records.items()} }")
                return records
            time.sleep(0.5)


JOB_PRIVATE_DIRS = (pathlib.Path("/tmp"), pathlib.Path("/dev/shm"))  # job_container/tmpfs


def hidden_from_jobs(paths: Iterable[pathlib.Path]) -> list[str]:
    """The paths a job under job_container/tmpfs cannot see (under a private directory)."""
    return [str(p) for p in paths
            if any(p.resolve().is_relative_to(d) for d in JOB_PRIVATE_DIRS)]


def _hidden(path: pathlib.Path) -> bool:
    """Whether a job cannot use path as written: it, or where its links lead, is under a
    private directory (a venv's bin/python links out of it, yet the job needs the link)."""
    return any(p.is_relative_to(d) for p in (path, path.resolve()) for d in JOB_PRIVATE_DIRS)


def _read_only(point: pathlib.Path) -> bool:
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4].replace("\\040", " ") == str(point):
            return "ro" in fields[5].split(",")
    return False


def running_cluster() -> Iterator[SlurmCluster]:
    """The body of a pytest fixture (module scope in tests/system/test_deploy_slurm.py): a started
    one-node Slurm, the checkout and venv exposed to its jobs wherever they are, stopped and
    removed after the tests; skips with the exact reason where it cannot be started."""
    cluster = SlurmCluster()
    try:
        cluster.__enter__()
        cluster.expose_checkout()
    except SlurmUnavailable as e:
        cluster.stop()
        pytest.skip(f"Slurm unavailable: {e}")
    try:
        yield cluster
    finally:
        cluster.stop()
