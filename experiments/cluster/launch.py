"""Launches a job, one rank per emulated host, and supervises it.

With the horovod backend, Horovod's own machinery does the distributed part: its host parsing
and slot assignment, its rendezvous server (bound to the cluster's bridge address), and its
run/slot environment variables. With the tensorflow backend, each rank gets the TF_CONFIG of a
cluster of the hosts' addresses, as a TFJob or crossover_tf.launch would write it, and
crossover_tf.launch's bind guard: its server listens on its host's address alone (TensorFlow's
would listen on every interface and run graphs for anyone), and on localhost "hosts" accepts
only its own user's connections. Only process start-up is ours, because each rank must start
inside its host's namespace, pinned to its CPUs, in its own session (so the whole process
group can be killed).
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import subprocess
import time
import zlib
from typing import TYPE_CHECKING, Mapping, Sequence

from crossover_tf._setup.devices import DEVICE_KEY_ENV
from crossover_tf.launch import bind_guard_env, tf_configs
from experiments.cluster import exit_hooks
from experiments.cluster.netns import EmulatedCluster, Host

if TYPE_CHECKING:  # Horovod's runner is imported only for the horovod backend (it is optional)
    from experiments.cluster.rendezvous import BoundRendezvousServer

POLL_INTERVAL_S = 0.1
TERMINATE_GRACE_S = 5.0
LOG_TAIL_LINES = 20


@dataclasses.dataclass
class Rank:
    """One started rank process and where its output goes."""
    rank: int
    host: Host
    process: subprocess.Popen
    log_path: pathlib.Path
    terminated: bool = False  # ended by the launcher (failure of another rank, or timeout)

    @property
    def exit_code(self) -> int | None:
        return self.process.poll()


@dataclasses.dataclass
class JobHandle:
    """A running job: its ranks, its rendezvous server (Horovod's; None for the tensorflow
    backend) and its deadline."""
    name: str
    ranks: list[Rank]
    rendezvous: BoundRendezvousServer | None
    started_at: float
    deadline: float
    failed_rank: int | None = None
    timed_out: bool = False
    finished_at: float | None = None
    _hook: int | None = None

    def done(self) -> bool:
        return all(r.exit_code is not None for r in self.ranks)

    def terminate(self) -> None:
        """Ends every still-running rank (SIGTERM, then SIGKILL after a grace period)."""
        terminate_ranks([r for r in self.ranks if r.exit_code is None])
        self.close()

    def close(self) -> None:
        """Stops the rendezvous server and reaps leftover children of finished ranks; idempotent."""
        for r in self.ranks:
            _signal_group(r.process.pid, signal.SIGKILL)
        if self._hook is not None:
            exit_hooks.unregister(self._hook)
            self._hook = None
            if self.rendezvous is not None:
                self.rendezvous.stop()
        if self.finished_at is None:
            self.finished_at = time.monotonic()


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def terminate_ranks(ranks: Sequence[Rank], grace_s: float = TERMINATE_GRACE_S) -> None:
    """SIGTERMs the process groups of `ranks`, SIGKILLs those still alive after `grace_s`."""
    for r in ranks:
        r.terminated = True
        _signal_group(r.process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(r.exit_code is None for r in ranks):
        time.sleep(POLL_INTERVAL_S)
    for r in ranks:
        _signal_group(r.process.pid, signal.SIGKILL)
        try:
            r.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:  # unkillable (D state): report it running, do not hang
            pass


def rank_env(host: Host, backend_env: Mapping[str, str], extra_env: Mapping[str, str],
             host_device_key: bool = True, defaults: Mapping[str, str] | None = None
             ) -> dict[str, str]:
    """Environment of one rank: `defaults` (the cluster's) under the caller's env, then
    extra_env, the backend's (Horovod's Gloo run + slot vars, or TF_CONFIG), the host's
    identity. With host_device_key the host's name is the rank's
    lease device key, so the jobs' ranks on one emulated host pair; without it an inherited key
    is dropped too, and the runtime keys the lease by the physical device (a real GPU), as a
    plain launch would."""
    env = {**(defaults or {}), **os.environ}
    if not host_device_key:
        env.pop(DEVICE_KEY_ENV, None)
    env.update(extra_env)
    env.update(backend_env)
    env.update({"CROSSOVER_HOST_INDEX": str(host.index), "PYTHONUNBUFFERED": "1"})
    if host_device_key:
        env[DEVICE_KEY_ENV] = host.name
    return {k: str(v) for k, v in env.items()}


def tf_config_port(job_name: str) -> int:
    """The first port of a tensorflow-backend job's servers (rank k listens on it + k): fixed
    by the job's name, so two jobs on one cluster (A and B) listen on different ports."""
    return 21000 + 64 * (zlib.crc32(job_name.encode()) % 400)


def tensorflow_envs(hosts: Sequence[Host], job_name: str) -> list[tuple[Host, dict[str, str]]]:
    """Each rank's TF_CONFIG and bind guard: its server on its host's address alone; where
    every host is this machine's own network (the localhost fallback), for this user's
    connections alone too (a peer in another namespace is not seen: not on emulated hosts)."""
    port = tf_config_port(job_name)
    configs = tf_configs([f"{h.address}:{port + k}" for k, h in enumerate(hosts)])
    local = all(h.namespace is None for h in hosts)
    return [(h, {"TF_CONFIG": config, **bind_guard_env(h.address, os.environ, local)})
            for h, config in zip(hosts, configs)]


def backend_envs(cluster: EmulatedCluster, backend: str, job_name: str
                 ) -> tuple[list[tuple[Host, dict[str, str]]], BoundRendezvousServer | None]:
    """Each rank's host and backend environment, in rank order, and Horovod's rendezvous."""
    if backend == "tensorflow":
        return tensorflow_envs(cluster.hosts, job_name), None
    if backend != "horovod":
        raise ValueError(f"backend must be 'horovod' or 'tensorflow', got {backend!r}")
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars

    from experiments.cluster.rendezvous import BoundRendezvousServer
    hosts_by_name = {h.name: h for h in cluster.hosts}
    plan = get_host_assignments(parse_hosts(",".join(f"{h.name}:1" for h in cluster.hosts)),
                                len(cluster.hosts))
    rendezvous = BoundRendezvousServer(cluster.rendezvous_address)
    port = rendezvous.start()
    rendezvous.init(plan)
    return [(hosts_by_name[slot.hostname],
             {**create_run_env_vars(cluster.rendezvous_address,
                                    [hosts_by_name[slot.hostname].iface], port),
              **create_slot_env_vars(slot)}) for slot in plan], rendezvous


def launch_job(cluster: EmulatedCluster, command: Sequence[str], *, job_name: str,
               env: Mapping[str, str] | None = None, log_dir: str | os.PathLike,
               timeout_s: float, host_device_key: bool = True,
               backend: str = "horovod") -> JobHandle:
    """Starts `command` once per host as one job of `backend` (a Horovod world, or a
    TensorFlow cluster from TF_CONFIG); logs go to <log_dir>/<job>/rank<k>.log.
    host_device_key: see rank_env."""
    if not cluster.hosts:
        raise RuntimeError("launch_job needs a started cluster (use `with EmulatedCluster(...)`)")
    ranks, rendezvous = backend_envs(cluster, backend, job_name)
    job_dir = pathlib.Path(log_dir) / job_name
    job_dir.mkdir(parents=True, exist_ok=True)
    now = time.monotonic()
    handle = JobHandle(job_name, [], rendezvous, now, now + timeout_s)
    handle._hook = exit_hooks.register(handle.terminate)
    try:
        for rank, (host, backend_env) in enumerate(ranks):
            argv = cluster.exec_prefix(host) + list(command)
            log_path = job_dir / f"rank{rank}.log"
            with open(log_path, "w") as log:
                log.write(f"# {job_name} rank {rank} on {host.name} ({host.address}, "
                          f"cpus {host.cpus}): {' '.join(argv)}\n")
                log.flush()
                process = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env=rank_env(host, backend_env, env or {}, host_device_key,
                                 cluster.rank_defaults()),
                    start_new_session=True)
            handle.ranks.append(Rank(rank, host, process, log_path))
    except BaseException:
        handle.terminate()
        raise
    return handle


def _log_tail(path: pathlib.Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"<log unreadable: {exc}>"


def _supervise_once(handle: JobHandle, now: float) -> None:
    """One monitoring step: a failed rank or a passed deadline ends the job's other ranks."""
    if handle.finished_at is not None:
        return
    if handle.failed_rank is None:
        failed = [r for r in handle.ranks if r.exit_code not in (None, 0)]
        if failed:
            handle.failed_rank = failed[0].rank
            handle.terminate()
            return
    if now >= handle.deadline:
        handle.timed_out = True
        handle.terminate()
    elif handle.done():
        handle.close()


def job_result(handle: JobHandle) -> dict:
    """JSON-able outcome of a finished job: exit codes, wall time, failed rank, log paths."""
    result = {
        "ok": not handle.timed_out and all(r.exit_code == 0 for r in handle.ranks),
        "exit_codes": [r.exit_code for r in handle.ranks],
        "timed_out": handle.timed_out,
        "wall_s": round((handle.finished_at or time.monotonic()) - handle.started_at, 3),
        "logs": [str(r.log_path) for r in handle.ranks],
        "terminated_ranks": [r.rank for r in handle.ranks if r.terminated],
        "failed_rank": handle.failed_rank, "failed_exit_code": None, "failed_log_tail": "",
    }
    if handle.failed_rank is not None:
        failed = handle.ranks[handle.failed_rank]
        result["failed_exit_code"] = failed.exit_code
        result["failed_log_tail"] = _log_tail(failed.log_path)
    return result


def wait_jobs(handles: Sequence[JobHandle], timeout_s: float | None = None) -> dict[str, dict]:
    """Waits for all jobs (each also bounded by its own timeout); returns {job name: result}."""
    overall = time.monotonic() + timeout_s if timeout_s is not None else float("inf")
    for h in handles:
        h.deadline = min(h.deadline, overall)
    while any(h.finished_at is None for h in handles):
        now = time.monotonic()
        for h in handles:
            _supervise_once(h, now)
        time.sleep(POLL_INTERVAL_S)
    return {h.name: job_result(h) for h in handles}
