"""The lease directory's listing and reading under planted names (issue 48, item 5): names that
fail the trust rule are counted apart and never read, the time bound covers the listing too,
and an observation's members are capped with the holder kept. No lease library: the reader
takes any read function, and the observer's JSON is parsed from text."""
from __future__ import annotations

import json
import os

import pytest

from crossover_tf.lease import segments
from crossover_tf.node import observer
from crossover_tf.node.directory_reader import read_directory


class Refused(OSError):
    pass


def _plant(directory, real: int, untrusted: int) -> None:
    for i in range(untrusted):
        (directory / f"crossover.a{i:05d}.dev").touch()  # empty: no lease
    for i in range(real):
        path = directory / f"crossover.z{i:04d}.dev"
        path.write_bytes(b"\0" * 64)
        path.chmod(0o600)


def test_the_listing_counts_names_that_fail_the_trust_rule_apart(tmp_path):
    _plant(tmp_path, real=3, untrusted=segments.MAX_SEGMENTS + 5)
    listing = segments.scan_segments(tmp_path)
    assert listing.real == 3 and listing.untrusted == segments.MAX_SEGMENTS + 5
    assert [s.group for s in listing.found[:3]] == ["z0000", "z0001", "z0002"]
    assert listing.not_shown == 8 and listing.complete


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files another owner")
def test_another_owners_names_that_pass_the_lstat_check_wait_their_turn(tmp_path):
    """Before (issue 59, item 7): 1,000 one-byte 0600 names of another user, sorted first,
    filled the first MAX_SEGMENTS and the real lease was never read. Now each owner's k-th
    name comes before any owner's (k+1)-th: the real lease is second."""
    for i in range(segments.MAX_SEGMENTS):
        path = tmp_path / f"crossover.a{i:04d}.dev"
        path.write_bytes(b"x")
        path.chmod(0o600)
        os.chown(path, 61003, 61003)
    _plant(tmp_path, real=2, untrusted=0)
    listing = segments.scan_segments(tmp_path)
    assert [s.group for s in listing.found[:4]] == ["a0000", "z0000", "a0001", "z0001"]
    assert listing.real == segments.MAX_SEGMENTS and listing.real_not_shown == 2


def test_reading_skips_untrusted_names_names_a_few_and_counts_them_all(tmp_path):
    """Before: every listed name was read, so 999 planted names made 999 reads and 999 lines.
    Now only names that may be leases are read, and name_untrusted more for their reasons."""
    _plant(tmp_path, real=2, untrusted=2000)
    opened = []

    def read_one(path, bound_s):
        opened.append(path.name)
        if path.name.startswith("crossover.a"):
            raise Refused(f"{path}: has permissions 0644")
        return "lease"

    result = read_directory(tmp_path, None, read_one, (Refused,), 5.0, 0.5, name_untrusted=4)
    assert [s.group for s, _ in result.read] == ["z0000", "z0001"]
    assert len(opened) == 2 + 4, opened
    assert result.untrusted == 2000 and result.skipped_files == 2000
    assert result.skipped == [], result.skipped
    assert len(result.untrusted_lines) == 4 + 1, result.untrusted_lines
    assert "1996 more" in result.untrusted_lines[4], result.untrusted_lines
    quiet = read_directory(tmp_path, None, read_one, (Refused,), 5.0, 0.5)
    assert len(opened) == 6 + 2 and quiet.untrusted == 2000  # name_untrusted=0: none read


def test_the_time_bound_covers_the_listing(tmp_path):
    """Before: the bound started after scan_segments, which lstat'ed every name however long
    that took. Now the listing stops at the bound, and says so."""
    _plant(tmp_path, real=1, untrusted=3000)
    result = read_directory(tmp_path, None, lambda path, bound_s: "lease", (Refused,), 1e-9, 0.5)
    assert result.read == []
    assert any("listing stopped" in line for line in result.skipped), result.skipped
    stopped = segments.scan_segments(tmp_path, deadline=0.0)
    assert not stopped.complete and stopped.found == []


def _observer_json(members: int, holder: int | None) -> str:
    usage = {"acquires": 1, "contended": 0, "handoffs": 0, "hold_ns": 0, "wait_ns": 0,
             "wait_buckets": [0] * 8, "link_turns": 0, "link_turn_waits": 0,
             "link_turn_wait_ns": 0}
    return json.dumps({
        "members": [{"job": f"j{i}", "pid": 100 + i, "pid_ns": 1, "holding": i == holder,
                     "usage": usage} for i in range(members)],
        "queue": [], "held_since_wall_ns": 0, "held_for_ns": 0, "overlapping_holds": 0,
        "handoffs": 0, "recoveries": 0, "wait_bucket_upper_ns": [1] * 7})


@pytest.mark.parametrize("holder", [None, 0, 40])
def test_an_observation_keeps_the_holder_and_caps_the_others(holder):
    whole = observer.parse_observation(_observer_json(63, holder))
    assert len(whole.members) == whole.member_count == 63
    capped = observer.parse_observation(_observer_json(63, holder), max_members=16)
    assert capped.member_count == 63 and len(capped.members) == 16
    if holder is not None:
        assert capped.holder is not None and capped.holder.job == f"j{holder}"
        assert capped.members[0].job == f"j{holder}"
    # The holder is kept whatever the cap: its age and job are the lease's, not a member's.
    none = observer.parse_observation(_observer_json(63, holder), max_members=0)
    assert [m.job for m in none.members] == ([] if holder is None else [f"j{holder}"])
