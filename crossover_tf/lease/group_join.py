"""The group's join check: a job waits, bounded, until its group's jobs are all on its
device's lease, and fails loudly otherwise.

Why: when jobs cannot see each other's lease (each container, pod or Slurm job with its own
/dev/shm), each finds an empty lease, never waits, and both compute at once with no error. A
job that knows how many jobs its group has can tell, and must say what to change.
"""
from __future__ import annotations

import math
import os
import pathlib
import time
from typing import Callable, Sequence

from absl import logging

from crossover_tf.lease.membership import Member

POLL_S = 0.05
MAX_GROUP_JOBS = 64  # the C++ core's kMaxProcesses: at most that many members on one lease


class GroupIncomplete(RuntimeError):
    """Fewer distinct jobs than the group declares came onto the lease within the timeout."""


class GroupOverfull(RuntimeError):
    """More distinct jobs than the group declares stayed on the lease for the whole timeout:
    a job of another pair under the same group name, or one started twice. Carrying on would
    share the device among more jobs than the link turns and the plan count."""


def validate_jobs(jobs: int) -> int:
    """Checks a group's job count (at most as many as one lease has members)."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= MAX_GROUP_JOBS:
        raise ValueError(f"crossover lease: jobs must be a whole number in [1, {MAX_GROUP_JOBS}], "
                         f"got {jobs!r}")
    return jobs


def validate_join_timeout(timeout_s: float) -> float:
    """Checks how long a job waits at start for its group (LeaseOptions.join_timeout_s)."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
            or not math.isfinite(timeout_s) or timeout_s <= 0:
        raise ValueError(f"crossover lease: join_timeout_s must be a positive number of "
                         f"seconds, got {timeout_s!r}")
    return timeout_s


def _jobs_on(seen: Sequence[Member]) -> tuple[list[str], str]:
    """The distinct job labels on a lease, and its members as a message names them."""
    who = ", ".join(f"job {m.job!r} (pid {m.pid})" for m in sorted(seen, key=lambda m: m.job))
    return sorted({m.job for m in seen}), who


def group_incomplete_message(path: pathlib.Path, seen: Sequence[Member], expected: int,
                             timeout_s: float) -> str:
    """What GroupIncomplete says: the lease file, who was there, what was expected, the usual
    causes and the setting that fixes them."""
    labels, who = _jobs_on(seen)
    return (
        f"crossover lease: waited {timeout_s:g} s for {expected} jobs on lease file {path}, "
        f"but saw {len(labels)}: {who or 'none'}. The other jobs of the group are not on this "
        "file: they did not start in time, or, most often, each job sees its own lease "
        "directory (/dev/shm by default), so the jobs would compute at once:\n"
        "  - Docker: each container has its own /dev/shm. Mount one volume into every "
        "container and make it the lease directory, or run them with --ipc=host.\n"
        "  - Kubernetes: two pods do not share /dev/shm. Mount one hostPath volume in both "
        "pods and make it the lease directory, or set hostIPC: true.\n"
        "  - Slurm with job_container/tmpfs: its Dirs (which include /dev/shm) give every job "
        "a private /dev/shm and /tmp. Point the lease directory at a directory outside the "
        "plugin's Dirs, e.g. on local disk.\n"
        "Fix: set CROSSOVER_LEASE_DIR=<a directory every job of the group sees on this host> "
        "(or lease_dir=...) in every job, on a local file system. A job meant to run alone "
        "declares jobs=1.")


def group_overfull_message(path: pathlib.Path, seen: Sequence[Member], expected: int,
                           timeout_s: float) -> str:
    """What GroupOverfull says: the lease file, every job on it, and what to change."""
    labels, who = _jobs_on(seen)
    return (
        f"crossover lease: the group declares {expected} job(s) (LeaseOptions.jobs), but "
        f"{len(labels)} stayed on lease file {path} for {timeout_s:g} s: {who}. More jobs "
        "than declared would share the device without the link turns or the plan counting "
        "them. Another pair uses this group name, or a job was started twice: give each pair "
        "its own group name, stop the extra job, or declare the group's real job count.")


def overfull_wait_message(path: pathlib.Path, seen: Sequence[Member], expected: int,
                          timeout_s: float) -> str:
    """What a job logs the moment it finds more jobs on its lease than the group declares:
    which job waits (this process's), who is there, and what happens next."""
    labels, who = _jobs_on(seen)
    me = next((m for m in seen if m.pid == os.getpid()), None)
    waiting = f"job {me.job!r} (pid {me.pid})" if me else f"this job (pid {os.getpid()})"
    return (
        f"crossover lease: {waiting} waits: {len(labels)} jobs are on lease file {path} "
        f"({who}), but the group declares {expected} (LeaseOptions.jobs). It waits until one "
        f"leaves (a job of an earlier run still exiting), up to {timeout_s:g} s "
        "(join_timeout_s), then fails with GroupOverfull; the jobs that started first may run "
        "meanwhile. Another pair uses this group name, or a job was started twice: give each "
        "pair its own group name, stop the extra job, or declare the group's real job count.")


def wait_for_jobs(read_members: Callable[[], Sequence[Member]], path: pathlib.Path, jobs: int,
                  timeout_s: float, poll_s: float = POLL_S) -> list[Member]:
    """Polls read_members (every poll_s, until timeout_s) until exactly `jobs` distinct job
    labels are live; returns the members. Raises GroupIncomplete if fewer came, GroupOverfull if
    more stayed the whole time (a job of a previous run still exiting leaves within it). More
    than `jobs` is logged at once, and again whenever the jobs on the lease change: a third job
    under a pair's name otherwise waited silently, while the first ran alone."""
    validate_jobs(jobs)
    validate_join_timeout(timeout_s)
    if not poll_s > 0:
        raise ValueError(f"crossover lease: poll interval must be > 0, got {poll_s!r}")
    deadline = time.monotonic() + timeout_s
    members: list[Member] = []
    logged: set[str] = set()  # the jobs last reported as too many
    for _ in range(int(timeout_s / poll_s) + 2):  # the deadline ends it first
        members = list(read_members())
        labels = {m.job for m in members}
        if len(labels) == jobs:
            return members
        if len(labels) > jobs and labels != logged:
            logging.warning(overfull_wait_message(path, members, jobs, timeout_s))
            logged = labels
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        time.sleep(min(poll_s, remaining))
    if len({m.job for m in members}) > jobs:
        raise GroupOverfull(group_overfull_message(path, members, jobs, timeout_s))
    raise GroupIncomplete(group_incomplete_message(path, members, jobs, timeout_s))
