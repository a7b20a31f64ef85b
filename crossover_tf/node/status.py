"""`python -m crossover_tf.lease status`: who is on the leases of a lease directory.

For an operator: each segment's group, device key and file, its members (job, pid, PID
namespace), the holder and the queue. Read-only: it inspects each file as an observer
(membership.read_snapshot: opened read-only and non-blocking, copied, never locked), so it never
becomes a member, creates, changes or repairs a segment, and needs no write access. Other local
users may plant files in a shared directory, so no file can stall it and no number of names
can hide a lease: the whole command is bounded (STATUS_BOUND_S), the leases come first (in
turns by owner, so another user's planted names come after each owner's first lease), a file
that may be a lease but fails the trust rule (ops/core/lease_dir.h) is skipped and named, names
that fail it by their lstat alone (empty, 0666) are counted apart, the first UNTRUSTED_NAMED
named, and names past the first MAX_SEGMENTS are counted, not silently dropped.
"""
from __future__ import annotations

import time

import tensorflow as tf

from crossover_tf.node.directory_reader import read_directory
from crossover_tf.lease.membership import INSPECT_BOUND_S, LeaseSnapshot, read_snapshot
from crossover_tf.lease.segments import SegmentFile, resolve_lease_dir

STATUS_BOUND_S = 10.0  # the whole command, however many files the directory holds
UNTRUSTED_NAMED = 10  # names failing the trust rule shown with the reason; the rest counted


def format_segment(segment: SegmentFile, snap: LeaseSnapshot, now_ns: int) -> str:
    """One lease's block of the status output."""
    lines = [f"lease {segment.path}", f"  group {segment.group}  device {segment.device_key}",
             f"  members ({len(snap.members)}):"]
    lines += [f"    job {m.job}  pid {m.pid}  pid_ns {m.pid_ns}" + ("  (holder)" if m.holding
                                                                      else "")
              for m in snap.members]
    holder = snap.holder
    if holder is None:
        lines.append("  holder: none")
    else:
        held_s = max(0.0, (now_ns - snap.held_since_ns) / 1e9)
        lines.append(f"  holder: job {holder.job}  pid {holder.pid}  for {held_s:.1f} s")
    lines.append(f"  queue ({len(snap.queue)}):")
    lines += [f"    {i}. job {w.job}  pid {w.pid}  priority {w.priority}  waited "
              f"{max(0.0, (now_ns - w.since_ns) / 1e9):.1f} s"
              for i, w in enumerate(snap.queue, 1)]
    return "\n".join(lines)


def status(lease_dir: str | None, group: str | None,
           bound_s: float = STATUS_BOUND_S) -> tuple[str, int]:
    """The status text and exit code (1 if some segment was skipped, could not be read, or was
    not reached within bound_s, or some name fails the trust rule)."""
    directory = resolve_lease_dir(lease_dir, observer=True)
    result = read_directory(directory, group, read_snapshot, (tf.errors.OpError,), bound_s,
                            INSPECT_BOUND_S, name_untrusted=UNTRUSTED_NAMED)
    if not result.read and not result.skipped and not result.untrusted:
        return f"no leases in {directory}" + (f" for group {group}" if group else ""), 0
    now_ns = time.time_ns()
    blocks = [format_segment(segment, snap, now_ns) for segment, snap in result.read]
    if result.skipped:
        blocks.append(f"skipped ({len(result.skipped)}):\n"
                      + "\n".join(f"  {s}" for s in result.skipped))
    if result.untrusted:
        blocks.append(f"not leases: {result.untrusted} name(s) that fail the trust rule "
                      "(planted, or left by a failed start):\n"
                      + "\n".join(f"  {s}" for s in result.untrusted_lines))
    return "\n".join(blocks), 1 if result.skipped or result.untrusted else 0
