"""`python -m crossover_tf.lease status`: who is on the leases of a lease directory.

For an operator: each segment's group, device key and file, its members (job, pid, PID
namespace), the holder and the queue. Read-only: it inspects each file as an observer
(membership.read_snapshot: opened read-only and non-blocking, copied, never locked), so it never
becomes a member, creates, changes or repairs a segment, and needs no write access. Other local
users may plant files in a shared directory, so no file can stall it: the whole command is
bounded (STATUS_BOUND_S), a file that fails the trust rule (ops/lease_dir.h) is skipped and
named, and names past the first MAX_SEGMENTS are counted, not silently dropped.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

import tensorflow as tf

from crossover_tf.lease.membership import INSPECT_BOUND_S, LeaseSnapshot, read_snapshot
from crossover_tf.lease.segments import (MAX_SEGMENTS, SegmentFile, resolve_lease_dir,
                                         scan_segments)

STATUS_BOUND_S = 10.0  # the whole command, however many files the directory holds


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
    not reached within bound_s)."""
    directory = resolve_lease_dir(lease_dir)
    listing = scan_segments(directory, group)
    if not listing.found:
        return f"no leases in {directory}" + (f" for group {group}" if group else ""), 0
    deadline = time.monotonic() + bound_s
    blocks, skipped, code = [], [], 0
    for index, segment in enumerate(listing.found):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            skipped.append(f"{len(listing.found) - index} lease file(s) not read: this "
                           f"command's {bound_s:g} s bound ran out")
            break
        try:
            snap = read_snapshot(segment.path, min(INSPECT_BOUND_S, remaining))
        except tf.errors.OpError as err:
            skipped.append(f"{segment.path}: {err.message}")
            continue
        blocks.append(format_segment(segment, snap, time.time_ns()))
    if listing.not_shown:
        skipped.append(f"{listing.not_shown} more lease file name(s) past the first "
                       f"{MAX_SEGMENTS} not shown: narrow with --group")
    if skipped:
        code = 1
        blocks.append(f"skipped ({len(skipped)}):\n" + "\n".join(f"  {s}" for s in skipped))
    return "\n".join(blocks), code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m crossover_tf.lease",
                                     description="Inspect device leases (read-only).")
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser("status", help="members, holder and queue of each lease")
    show.add_argument("--lease_dir", default=None,
                      help="lease directory (default: $CROSSOVER_LEASE_DIR, else /dev/shm)")
    show.add_argument("--group", default=None, help="only this group's leases")
    args = parser.parse_args(argv)
    # Before TensorFlow first touches a device (lazily, at the first op): reading a lease needs
    # no GPU, and must never take GPU memory from the jobs it watches.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        text, code = status(args.lease_dir, args.group)
    except ValueError as err:  # LeaseDirError, or a bad group name
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
