"""Names of device-lease segments in /dev/shm, without TensorFlow.

One rule for group and device-key names (the C++ op enforces the same), one place that spells
the segment path: the op wrapper, launchers' cleanup and tests all use these.
"""
from __future__ import annotations

import pathlib
import re
from typing import Iterable

SHM_DIR = pathlib.Path("/dev/shm")
SEGMENT_PREFIX = "crossover"  # the C++ op names segments /dev/shm/crossover.<group>.<device>
GROUP_MAX_LEN, DEVICE_KEY_MAX_LEN = 64, 32
_NAME_RE = re.compile(r"[A-Za-z0-9_-]+")  # whole name: fullmatch, so no "\n" slips past $
_MAX_SEGMENTS = 1000  # bound on how many segments one cleanup touches


def validate_name(kind: str, value: str, max_len: int) -> str:
    """Checks a group or device key early, with the same rule as the C++ side."""
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value) or len(value) > max_len:
        raise ValueError(f"crossover lease {kind} {value!r} is invalid: use 1-{max_len} "
                         "characters from [A-Za-z0-9_-]")
    return value


def segment_path(group: str, device_key: str) -> pathlib.Path:
    """Where the lease's shared-memory segment lives."""
    return SHM_DIR / (f"{SEGMENT_PREFIX}.{validate_name('group', group, GROUP_MAX_LEN)}."
                      f"{validate_name('device key', device_key, DEVICE_KEY_MAX_LEN)}")


def unlink_segment(group: str, device_key: str) -> None:
    """Removes one lease's segment name; processes that have it open keep working."""
    segment_path(group, device_key).unlink(missing_ok=True)


def remove_group_segments(groups: Iterable[str]) -> list[str]:
    """Unlinks every device's segment of each group (names validated, so no glob widening);
    processes that have a segment mapped keep working. Returns the removed paths."""
    removed = []
    for group in groups:
        pattern = f"{SEGMENT_PREFIX}.{validate_name('group', group, GROUP_MAX_LEN)}.*"
        for segment in list(SHM_DIR.glob(pattern))[:_MAX_SEGMENTS]:
            segment.unlink(missing_ok=True)
            removed.append(str(segment))
    return removed
