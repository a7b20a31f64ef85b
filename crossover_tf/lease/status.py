"""`python -m crossover_tf.lease status`: who is on the leases of a lease directory.

For an operator: each segment's group, device key and file, its members (job, pid, PID
namespace), the holder and the queue. Read-only in effect: it inspects each file as an
observer (membership.read_snapshot), so it never becomes a member, creates a segment or repairs
one, and waits for a lease's internal mutex only briefly.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

import tensorflow as tf

from crossover_tf.lease.membership import LeaseSnapshot, read_snapshot
from crossover_tf.lease.segments import SegmentFile, find_segments, resolve_lease_dir


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


def status(lease_dir: str | None, group: str | None) -> tuple[str, int]:
    """The status text and exit code (1 if some segment could not be read)."""
    directory = resolve_lease_dir(lease_dir)
    found = find_segments(directory, group)
    if not found:
        return f"no leases in {directory}" + (f" for group {group}" if group else ""), 0
    blocks, code = [], 0
    for segment in found:
        try:
            snap = read_snapshot(segment.path)
        except tf.errors.OpError as err:
            blocks.append(f"lease {segment.path}\n  cannot read it: {err.message}")
            code = 1
            continue
        blocks.append(format_segment(segment, snap, time.time_ns()))
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
