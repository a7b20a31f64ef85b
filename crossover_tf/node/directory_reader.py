"""Reads every lease of a lease directory within one time bound: what `status` prints and what
the node exporter serves.

Other local users may plant files in a shared directory, so no file may stall a reader: the
whole read is bounded, a file that cannot be read (fails the trust rule, unreadable, another
layout) is skipped and named, and names past the first MAX_SEGMENTS are counted, never dropped
silently. Plain Python: the reader of one file is the caller's (the TensorFlow op for status,
the observer library for the exporter).
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable, Generic, TypeVar

from crossover_tf.lease.segments import MAX_SEGMENTS, SegmentFile, scan_segments

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class DirectoryRead(Generic[T]):
    """The leases read (those that may be real first, then by name: scan_segments), and one
    line for each file or group of files skipped."""
    read: list[tuple[SegmentFile, T]]
    skipped: list[str]


def read_directory(lease_dir: str | os.PathLike, group: str | None,
                   read_one: Callable[[os.PathLike, float], T],
                   errors: tuple[type[BaseException], ...], bound_s: float,
                   file_bound_s: float) -> DirectoryRead[T]:
    """Reads each lease segment of the directory (of one group if given) with
    read_one(path, bound), giving each file at most file_bound_s and all of them bound_s; an
    error of the types in `errors` skips that file with its message."""
    listing = scan_segments(lease_dir, group)
    deadline = time.monotonic() + bound_s
    read, skipped = [], []
    for index, segment in enumerate(listing.found):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            skipped.append(f"{len(listing.found) - index} lease file(s) not read: the "
                           f"{bound_s:g} s bound ran out")
            break
        try:
            read.append((segment, read_one(segment.path, min(file_bound_s, remaining))))
        except errors as err:
            skipped.append(f"{segment.path}: {getattr(err, 'message', None) or err}")
    if listing.not_shown:
        skipped.append(f"{listing.not_shown} more lease file name(s) past the first "
                       f"{MAX_SEGMENTS} not shown: narrow with --group")
    return DirectoryRead(read, skipped)
