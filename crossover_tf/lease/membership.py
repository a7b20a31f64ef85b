"""Who is on a lease: its members (one per process that opened it, under its job's label), the
holder and the queue.

Two readers, on purpose: a member (the group's join check, group_join.py) reads the segment it
has mapped (CrossoverLeaseMembers), never a file looked up again by name, so a segment renamed or
swapped under the name cannot fake the check; an observer (status.py) reads a file without
becoming a member (CrossoverLeaseInspect: read-only, non-blocking, checked by the trust rule).
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import numpy as np

JOB_MAX_LEN = 64  # the C++ core's kMaxJobLen
_JOB_RE = re.compile(r"[A-Za-z0-9_.:@-]+")
PRIORITY_NAMES = {0: "secondary", 1: "normal", 2: "primary"}
INSPECT_BOUND_S = 0.5  # longest an observer retries for a consistent copy of one segment


def validate_job(job: str | None) -> str:
    """Checks a job label early, with the same rule as the C++ side; None or "" is the
    per-process default the core makes ("<host>:<pid>")."""
    if job is None or job == "":
        return ""
    if not isinstance(job, str) or not _JOB_RE.fullmatch(job) or len(job) > JOB_MAX_LEN:
        raise ValueError(f"crossover lease job label {job!r} is invalid: use 1-{JOB_MAX_LEN} "
                         "characters from [A-Za-z0-9_.:@-] (or none: <host>:<pid>)")
    return job


@dataclasses.dataclass(frozen=True)
class Member:
    """A live process on the lease."""
    job: str
    pid: int
    pid_ns: int      # PID namespace inode: pids of two namespaces are not comparable
    holding: bool


@dataclasses.dataclass(frozen=True)
class Waiter:
    """A thread waiting for the lease, in queue order."""
    job: str
    pid: int
    pid_ns: int
    priority: str
    since_ns: int    # CLOCK_REALTIME ns when it queued


@dataclasses.dataclass(frozen=True)
class LeaseSnapshot:
    """The lease at one moment."""
    members: tuple[Member, ...]
    queue: tuple[Waiter, ...]
    held_since_ns: int  # CLOCK_REALTIME ns; 0: free

    @property
    def holder(self) -> Member | None:
        return next((m for m in self.members if m.holding), None)

    def jobs(self) -> set[str]:
        return {m.job for m in self.members}


def _labels(jobs: Any) -> list[str]:
    return [j.decode() if isinstance(j, bytes) else str(j) for j in np.asarray(jobs).tolist()]


def snapshot_from_op_output(members: Any, member_jobs: Any, waiters: Any, waiter_jobs: Any,
                            held_since_ns: Any) -> LeaseSnapshot:
    """Decodes CrossoverLeaseInspect's outputs ([pid, pid_ns, holding] and
    [pid, pid_ns, priority, since_ns] rows with their labels)."""
    return LeaseSnapshot(
        members=tuple(Member(job, int(pid), int(ns), bool(holding)) for job, (pid, ns, holding)
                      in zip(_labels(member_jobs), np.asarray(members).tolist())),
        queue=tuple(Waiter(job, int(pid), int(ns), PRIORITY_NAMES.get(int(prio), str(prio)),
                           int(since)) for job, (pid, ns, prio, since)
                    in zip(_labels(waiter_jobs), np.asarray(waiters).tolist())),
        held_since_ns=int(held_since_ns))


def read_snapshot(path: str | os.PathLike, bound_s: float = INSPECT_BOUND_S) -> LeaseSnapshot:
    """Reads the segment file at path as an observer: it never registers, creates, repairs or
    blocks (raises tf.errors.OpError naming the path if the file is missing, unreadable or
    fails the trust rule)."""
    # Here, not at the top: the rest of this module (job labels, the snapshot types) serves
    # the TensorFlow-free observer and exporter, and the loader imports TensorFlow.
    from crossover_tf.lease.loader import load_library
    outputs = load_library().crossover_lease_inspect(os.fspath(path), bound_seconds=bound_s)
    return snapshot_from_op_output(*outputs)
