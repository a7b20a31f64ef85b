"""Starts N local tasks of one job with their TF_CONFIG, as `horovodrun -np N -H localhost:N`
starts Horovod ranks: for the `tensorflow` communication backend on one machine (tests, the
emulated cluster's hosts). A real cluster's TF_CONFIG comes from its scheduler (Kubeflow's
TFJob) or Slurm's resolver instead.

  python -m crossover_tf.launch -np 2 [--address 127.0.0.1] [--timeout_s S] -- python train.py

The tasks listen on --address only, and hear only their own user. TensorFlow's gRPC server
binds every interface whatever TF_CONFIG says, and runs graphs (reads and writes files as this
user) for anyone who reaches it; the launcher preloads its bind guard
(ops/launch/bind_address.c) into the tasks so that the server binds --address instead (a
socket listening unbound too), and accepts only connections from this machine's sockets of the
tasks' own user (all the tasks are local): no other host, and no other local user, can run
graphs on them. --address 0.0.0.0 is refused; --listen_on_all_interfaces gives TensorFlow's
own behaviour back, for a trusted network.

Each task's output lines are prefixed with its rank. When one task fails, the others are
stopped (a peer left in a collective would wait for its timeout); past --timeout_s all are
killed and the exit status is 124, as timeout(1)'s. A task killed by a signal gives 128 + its
number, as a shell reports it. The tasks die with the launcher, however it ends (SIGTERM,
SIGKILL): each asks the kernel for SIGKILL when its parent dies.
"""
from __future__ import annotations

import argparse
import ctypes
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Mapping, Sequence

from crossover_tf.lease.library_paths import library_candidates

TIMED_OUT = 124
_GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1  # prctl(2)
BIND_GUARD = "_bind_address.so"
BIND_ADDRESS_ENV = "CROSSOVER_BIND_ADDRESS"  # read by the bind guard
ACCEPT_OWN_USER_ENV = "CROSSOVER_ACCEPT_OWN_USER"  # read by the bind guard: "1" turns it on
BIND_GUARD_CANDIDATES = library_candidates(BIND_GUARD)  # beside the op library


def refuse_every_interface(address: str) -> None:
    """0.0.0.0 as the tasks' address would listen on every interface without saying so."""
    try:
        unspecified = ipaddress.ip_address(address).is_unspecified
    except ValueError:
        return
    if unspecified:
        raise ValueError(f"crossover_tf.launch: --address {address} would let anyone who "
                         "reaches this machine run graphs as this user: give the address the "
                         "tasks listen on (127.0.0.1 for one machine); to listen on every "
                         f"interface on a trusted network, drop --address {address} and pass "
                         "--listen_on_all_interfaces alone")


def bind_guard_env(address: str, env: Mapping[str, str], own_user_only: bool = False
                   ) -> dict[str, str]:
    """The variables that make a task's servers listen on address only: the bind guard
    preloaded (before anything env already preloads) and told the address; with
    own_user_only, told too to accept only this machine's connections of the task's user
    (for tasks that are all on this machine: a peer on another host would be refused)."""
    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        raise ValueError(f"crossover_tf.launch: --address must be an IPv4 address (the tasks "
                         f"listen on it alone), got {address!r}") from None
    refuse_every_interface(address)
    found = [p for p in BIND_GUARD_CANDIDATES if p.is_file()]
    if not found:
        raise ValueError(
            f"crossover_tf.launch: the bind guard {BIND_GUARD} is not built (looked in "
            f"{', '.join(map(str, BIND_GUARD_CANDIDATES))}); build it with "
            "`make -C ops lib PYTHON=$(which python)` or reinstall crossover_tf. Without it "
            "TensorFlow's server would listen on every interface; --listen_on_all_interfaces "
            "accepts that on a trusted network.")
    preload = " ".join(filter(None, [str(found[0]), env.get("LD_PRELOAD", "")]))
    return {"LD_PRELOAD": preload, BIND_ADDRESS_ENV: address,
            ACCEPT_OWN_USER_ENV: "1" if own_user_only else "0"}


def free_ports(address: str, count: int) -> list[int]:
    """count ports free on address now (held open together, so they are distinct)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((address, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def tf_configs(workers: Sequence[str]) -> list[str]:
    """One TF_CONFIG per task: every task a worker, task i listening at workers[i]
    ("host:port"); the emulated cluster's launcher writes its ranks' with it too."""
    cluster = {"worker": list(workers)}
    return [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
            for i in range(len(workers))]


def _die_with_parent() -> None:
    """In the task, before exec: SIGKILL when the launcher dies (even by SIGKILL, which runs
    none of its own clean-up), so that no rank outlives it holding ports and a lease."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # runs run()'s finally: the tasks are stopped


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _forward(stream: IO[str], rank: int, out: IO[str]) -> None:
    for line in stream:
        out.write(f"[{rank}]: {line}")
        out.flush()


def _stop(procs: Sequence[subprocess.Popen], sig: int) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass


def run(command: Sequence[str], num_proc: int, address: str = "127.0.0.1",
        timeout_s: float = 0.0, env: dict[str, str] | None = None,
        listen_on_all_interfaces: bool = False) -> int:
    """Runs command as num_proc tasks; returns 0, the first failing task's status, or 124.
    The tasks' servers listen on address alone, for their own user's local connections alone,
    unless listen_on_all_interfaces."""
    if num_proc < 1:
        raise ValueError(f"crossover_tf.launch: -np must be >= 1, got {num_proc}")
    if not command:
        raise ValueError("crossover_tf.launch: no command given (put it after --)")
    refuse_every_interface(address)
    base = dict(os.environ if env is None else env)
    if not listen_on_all_interfaces:
        base.update(bind_guard_env(address, base, own_user_only=True))
    procs, threads = [], []
    workers = [f"{address}:{port}" for port in free_ports(address, num_proc)]
    for rank, config in enumerate(tf_configs(workers)):
        proc = subprocess.Popen(list(command), env={**base, "TF_CONFIG": config},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", start_new_session=True,
                                preexec_fn=_die_with_parent)
        thread = threading.Thread(target=_forward, args=(proc.stdout, rank, sys.stdout),
                                  daemon=True)
        thread.start()
        procs.append(proc)
        threads.append(thread)
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else float("inf")
    status = 0
    try:
        while [p.poll() for p in procs].count(None):  # polls every task (any() stops early)
            failed = [_status(p.returncode) for p in procs if p.returncode not in (None, 0)]
            if failed and not status:
                status = failed[0]
                _stop(procs, signal.SIGTERM)
                deadline = min(deadline, time.monotonic() + _GRACE_S)
            if time.monotonic() > deadline:
                status = status or TIMED_OUT
                print(f"crossover_tf.launch: stopping the tasks "
                      f"({'a task failed' if status != TIMED_OUT else f'past {timeout_s} s'})",
                      file=sys.stderr)
                _stop(procs, signal.SIGKILL)
                break
            time.sleep(0.1)
    finally:
        _stop(procs, signal.SIGKILL)
        for proc in procs:
            proc.wait()
        for thread in threads:
            thread.join(timeout=_GRACE_S)
    return status or next((_status(p.returncode) for p in procs if p.returncode), 0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m crossover_tf.launch",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("-np", "--num_proc", type=int, required=True)
    parser.add_argument("--address", default="127.0.0.1",
                        help="the IPv4 address every task listens on, and only on (one "
                             "machine; the default reaches no other host; not 0.0.0.0)")
    parser.add_argument("--listen_on_all_interfaces", action="store_true",
                        help="let TensorFlow's servers listen on every interface and accept "
                             "anyone, as they do by default: anyone who reaches a port can run "
                             "graphs as this user, so only on a trusted network")
    parser.add_argument("--timeout_s", type=float, default=0.0,
                        help="kill all tasks past this many seconds (0: no limit)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    signal.signal(signal.SIGHUP, _exit_on_sigterm)
    try:
        return run(command, args.num_proc, args.address, args.timeout_s,
                   listen_on_all_interfaces=args.listen_on_all_interfaces)
    except ValueError as err:
        parser.error(str(err))
        return 2


if __name__ == "__main__":
    sys.exit(main())
