"""Reads a lease as an observer without TensorFlow: members with their usage counters, the
holder, the queue and the lease's totals.

The node exporter runs once per node beside the jobs; importing TensorFlow would cost it
seconds and hundreds of MiB to read a few KiB. It reads through `_lease_observer.so`, a small
library of the lease core with a C entry point (ops/core/lease_observer.cc), built with the op
library from the same sources, so both read one segment layout. The read is the one `status`
makes: read-only and non-blocking, the trust rule checked (ops/core/lease_dir.h); nothing is joined,
created or repaired.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import json
import os
import pathlib

from crossover_tf.lease.library_paths import library_candidates
from crossover_tf.lease.membership import PRIORITY_NAMES, Member, Waiter

LIBRARY_NAME = "_lease_observer.so"
# $CROSSOVER_LEASE_OBSERVER (explicit), else beside the op library (lease.library_paths).
LIBRARY_CANDIDATES = library_candidates(LIBRARY_NAME)
OBSERVE_BOUND_S = 0.5  # longest one read retries for a consistent copy of a segment
MAX_OBSERVE_BOUND_S = 60.0  # the core's kMaxInspectBoundS


class LeaseReadError(OSError):
    """A lease file could not be read as an observer (missing, unreadable, another layout, or
    refused by the trust rule); the message names the file and why."""


@dataclasses.dataclass(frozen=True)
class Usage:
    """One member's use of the lease since it joined (LeaseUsage in ops/core/lease_types.h).
    Counters never decrease while the member lives; hold_s includes its current hold."""
    acquires: int
    contended: int
    handoffs: int
    hold_s: float
    wait_s: float
    wait_buckets: tuple[int, ...]  # acquisitions per wait bucket (not cumulative)
    link_turns: int
    link_turn_waits: int
    link_turn_wait_s: float


@dataclasses.dataclass(frozen=True)
class ObservedMember(Member):
    """A live member, with its counters."""
    usage: Usage


@dataclasses.dataclass(frozen=True)
class Observation:
    """A lease at one moment, as an observer reads it."""
    members: tuple[ObservedMember, ...]
    queue: tuple[Waiter, ...]
    held_for_s: float           # the current hold so far; 0 while free
    overlapping_holds: int      # must be 0 (ops/core/lease_segment.h: SharedLease::inside)
    handoffs: int
    recoveries: int
    wait_bucket_upper_s: tuple[float, ...]  # the buckets' upper bounds (the last: +Inf)
    member_count: int  # live members in all: more than len(members) if capped (max_members)

    @property
    def holder(self) -> ObservedMember | None:
        return next((m for m in self.members if m.holding), None)


def _find_library() -> pathlib.Path:
    explicit = os.environ.get("CROSSOVER_LEASE_OBSERVER")
    candidates = (pathlib.Path(explicit),) if explicit else LIBRARY_CANDIDATES
    for path in candidates:
        if path.exists():
            return path
    raise FileNotFoundError(
        f"crossover_tf lease observer library not found (looked in "
        f"{[str(c) for c in candidates]}); it is built with the op library: `pip install "
        "--no-build-isolation .`, scripts/install.sh, or `make -C ops lib "
        "PYTHON=$(which python)`")


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(_find_library()))
    lib.crossover_lease_observe.argtypes = [ctypes.c_char_p, ctypes.c_double,
                                            ctypes.POINTER(ctypes.c_void_p)]
    lib.crossover_lease_observe.restype = ctypes.c_int
    lib.crossover_lease_free.argtypes = [ctypes.c_void_p]
    lib.crossover_lease_free.restype = None
    return lib


def check_library() -> None:
    """Loads the observer library now (FileNotFoundError, naming where it looked, if it is not
    built): a reader that starts without it must fail at start, not at its first read."""
    _library()


def _usage(raw: dict) -> Usage:
    return Usage(acquires=raw["acquires"], contended=raw["contended"], handoffs=raw["handoffs"],
                 hold_s=raw["hold_ns"] / 1e9, wait_s=raw["wait_ns"] / 1e9,
                 wait_buckets=tuple(raw["wait_buckets"]), link_turns=raw["link_turns"],
                 link_turn_waits=raw["link_turn_waits"],
                 link_turn_wait_s=raw["link_turn_wait_ns"] / 1e9)


def parse_observation(text: str, max_members: int | None = None) -> Observation:
    """Decodes the observer library's JSON (ops/core/lease_observer.cc). With max_members, at
    most that many members are kept (the holder always: the lease's holder is one of its
    facts), the holder first, then the others in slot order; member_count keeps the whole
    number. A segment's 64 slots can be forged by whoever may write it, and each member kept
    costs its reader objects and, in the exporter, its series."""
    raw = json.loads(text)
    members = raw["members"]
    if max_members is not None and len(members) > max_members:
        holders = [m for m in members if m["holding"]][:1]
        members = holders + [m for m in members if not m["holding"]][
            :max(0, max_members - len(holders))]
    return Observation(
        members=tuple(ObservedMember(m["job"], m["pid"], m["pid_ns"], m["holding"],
                                     _usage(m["usage"])) for m in members),
        queue=tuple(Waiter(w["job"], w["pid"], w["pid_ns"],
                                   PRIORITY_NAMES.get(w["priority"], str(w["priority"])),
                                   w["since_wall_ns"]) for w in raw["queue"]),
        held_for_s=raw["held_for_ns"] / 1e9, overlapping_holds=raw["overlapping_holds"],
        handoffs=raw["handoffs"], recoveries=raw["recoveries"],
        wait_bucket_upper_s=tuple(ns / 1e9 for ns in raw["wait_bucket_upper_ns"]),
        member_count=len(raw["members"]))


def observe(path: str | os.PathLike, bound_s: float = OBSERVE_BOUND_S,
            max_members: int | None = None) -> Observation:
    """Reads the lease segment file at path as an observer (at most max_members members kept:
    parse_observation); raises LeaseReadError naming the path if it cannot (missing,
    unreadable, another layout, or refused by the trust rule)."""
    if not 0 < bound_s <= MAX_OBSERVE_BOUND_S:
        raise ValueError(f"observer bound must be in (0, {MAX_OBSERVE_BOUND_S:g}] s, "
                         f"got {bound_s!r}")
    lib = _library()
    out = ctypes.c_void_p()
    code = lib.crossover_lease_observe(os.fsencode(path), bound_s, ctypes.byref(out))
    if not out.value:
        raise MemoryError(f"reading lease {path}: out of memory")
    try:
        text = ctypes.string_at(out.value).decode("utf-8", "replace")
    finally:
        lib.crossover_lease_free(out)
    if code != 0:
        raise LeaseReadError(text)
    return parse_observation(text, max_members)
