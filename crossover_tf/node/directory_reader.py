"""Reads every lease of a lease directory within one time bound: what `status` prints and what
the node exporter serves.

Other local users may plant files in a shared directory, so no file may stall a reader and no
number of names may hide a lease or swamp the reader: the whole read, listing included, is
bounded; names are read in turns by owner (scan_segments: every owner's first lease before
anyone's second), so one user's names, even ones that pass the trust rule (one-byte 0600
files, forged segments), cannot push another's lease out of the read; names that fail the
trust rule by their lstat alone (empty, 0666: anyone may make them) are counted apart from
the leases and never read (status names the first few, with the reader's reason); a file
that may be a lease but cannot be read (refused by the trust rule, unreadable, another
layout) is skipped and named; and names past the first MAX_SEGMENTS are counted, never
dropped silently. Plain Python: the reader of one file is the caller's (the
TensorFlow op for status, the observer library for the exporter).
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
    """The leases read (those that may be real, by name: scan_segments), one line for each file
    or group of files that may be a lease and was skipped, and, apart from them, the names that
    fail the trust rule by their lstat alone (untrusted: how many; untrusted_lines: the first
    few named with the reader's reason, then one line for the rest). skipped_files counts files
    not read: those skipped and every untrusted name."""
    read: list[tuple[SegmentFile, T]]
    skipped: list[str]
    untrusted: int = 0
    untrusted_lines: list[str] = dataclasses.field(default_factory=list)
    skipped_files: int = 0


def read_directory(lease_dir: str | os.PathLike, group: str | None,
                   read_one: Callable[[os.PathLike, float], T],
                   errors: tuple[type[BaseException], ...], bound_s: float,
                   file_bound_s: float, name_untrusted: int = 0) -> DirectoryRead[T]:
    """Reads each lease segment of the directory (of one group if given) with
    read_one(path, bound), giving each file at most file_bound_s and the listing and all reads
    together bound_s; an error of the types in `errors` skips that file with its message.
    Names that fail the trust rule by their lstat are not read, only counted, except the first
    name_untrusted of them (status: their reason, from the reader)."""
    deadline = time.monotonic() + bound_s
    listing = scan_segments(lease_dir, group, deadline=deadline)
    read, skipped, skipped_files = [], [], 0
    if not listing.complete:
        skipped.append(f"listing stopped after {len(listing.found) + listing.not_shown} lease "
                       f"file name(s): the {bound_s:g} s bound ran out")
    for index, segment in enumerate(listing.found[:listing.real]):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            skipped.append(f"{listing.real - index} lease file(s) not read: the "
                           f"{bound_s:g} s bound ran out")
            skipped_files += listing.real - index
            break
        try:
            read.append((segment, read_one(segment.path, min(file_bound_s, remaining))))
        except errors as err:
            skipped.append(f"{segment.path}: {getattr(err, 'message', None) or err}")
            skipped_files += 1
    if listing.real_not_shown:
        skipped.append(f"{listing.real_not_shown} more lease file name(s) past the first "
                       f"{MAX_SEGMENTS} not shown: narrow with --group")
        skipped_files += listing.real_not_shown
    untrusted_lines = []  # a name read without error here was changed since its lstat: shown
    for segment in listing.found[listing.real:listing.real + name_untrusted]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            read.append((segment, read_one(segment.path, min(file_bound_s, remaining))))
        except errors as err:
            untrusted_lines.append(f"{segment.path}: {getattr(err, 'message', None) or err}")
    named = len(untrusted_lines)
    if listing.untrusted > named:
        untrusted_lines.append(
            f"{listing.untrusted - named} {'more ' if named else ''}name(s) not read: each "
            "fails the trust rule by its lstat (empty, not a regular file, or not private to "
            "its owner or the group's 0660)")
    return DirectoryRead(read, skipped, listing.untrusted, untrusted_lines,
                         skipped_files + listing.untrusted)
