"""Where device-lease segments live, and their names, without TensorFlow.

One rule for group and device-key names (the C++ op enforces the same), one place that resolves
and checks the lease directory and spells the segment path: the op wrapper, the status command,
launchers' cleanup and tests all use these.

The directory is `lease_dir` if given, else $CROSSOVER_LEASE_DIR, else /dev/shm. Containers and
Slurm's job_container/tmpfs give each job its own /dev/shm, so jobs that must take turns on one
device name a directory they share. It must be on a local file system: the lease's futex and
file locks do not work across hosts, so a network (or FUSE) file system is refused.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import os
import pathlib
import re
from typing import Iterable

DEFAULT_LEASE_DIR = pathlib.Path("/dev/shm")
LEASE_DIR_ENV = "CROSSOVER_LEASE_DIR"
SHARED_GROUP_ENV = "CROSSOVER_LEASE_SHARED_GROUP"  # group mode for every job of a script
SEGMENT_PREFIX = "crossover"  # the C++ op names segments <dir>/crossover.<group>.<device>
GROUP_MAX_LEN, DEVICE_KEY_MAX_LEN = 64, 32
_NAME_RE = re.compile(r"[A-Za-z0-9_-]+")  # whole name: fullmatch, so no "\n" slips past $
_MAX_SEGMENTS = 1000  # bound on how many segments one cleanup or status touches

# statfs f_type of the file systems a lease directory must not be on (the C++ core's
# NonLocalFileSystem keeps the same table): refused, not warned, since a lease there would
# silently exclude nobody on another host. FUSE is refused too: its locks depend on the daemon.
NON_LOCAL_FILE_SYSTEMS = {
    0x6969: "nfs", 0x517B: "smb", 0xFF534D42: "cifs", 0xFE534D42: "smb2", 0x01021997: "9p",
    0x00C36400: "ceph", 0x65735546: "fuse", 0x5346414F: "afs", 0x73757245: "coda",
    0x0BD00BD0: "lustre", 0x47504653: "gpfs", 0x01161970: "gfs2", 0x7461636F: "ocfs2",
}


class LeaseDirError(ValueError):
    """The lease directory cannot hold a lease: missing, not a directory, or not local."""


def validate_name(kind: str, value: str, max_len: int) -> str:
    """Checks a group or device key early, with the same rule as the C++ side."""
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value) or len(value) > max_len:
        raise ValueError(f"crossover lease {kind} {value!r} is invalid: use 1-{max_len} "
                         "characters from [A-Za-z0-9_-]")
    return value


def file_system_type(path: pathlib.Path) -> int:
    """statfs(2)'s f_type of path (os.statvfs does not report it); f_type is the first word of
    struct statfs on every Linux architecture."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    buf = ctypes.create_string_buffer(256)  # larger than struct statfs anywhere
    if libc.statfs(os.fsencode(path), buf) != 0:
        err = ctypes.get_errno()
        raise LeaseDirError(f"crossover lease directory {path}: statfs failed: "
                            f"{os.strerror(err)}")
    return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF


def check_local(path: pathlib.Path, f_type: int) -> None:
    """Raises LeaseDirError, naming path, if f_type is a file system the lease cannot use."""
    kind = NON_LOCAL_FILE_SYSTEMS.get(f_type)
    if kind is not None:
        raise LeaseDirError(
            f"crossover lease directory {path} is on a {kind} file system (f_type "
            f"{f_type:#x}), not a local one: the lease's futex and file locks do not work "
            "across hosts, so jobs that share this directory from two hosts would compute at "
            "once without an error. Use a directory on a local file system of this host that "
            "every job of the group on it sees (a tmpfs such as /dev/shm, or a local disk)")


def resolve_lease_dir(explicit: str | os.PathLike | None = None) -> pathlib.Path:
    """The lease directory: explicit, else $CROSSOVER_LEASE_DIR, else /dev/shm; resolved to an
    absolute path and checked (it exists, is a directory, is on a local file system)."""
    chosen = explicit if explicit not in (None, "") else os.environ.get(LEASE_DIR_ENV) or None
    directory = pathlib.Path(chosen) if chosen is not None else DEFAULT_LEASE_DIR
    source = "" if explicit not in (None, "") or chosen is None else f" (from ${LEASE_DIR_ENV})"
    if not directory.exists():
        raise LeaseDirError(f"crossover lease directory {directory}{source} does not exist: "
                            "create it (it must be the same directory for every job of the "
                            "group on this host)")
    if not directory.is_dir():
        raise LeaseDirError(f"crossover lease directory {directory}{source} is not a directory")
    resolved = directory.resolve()
    check_local(resolved, file_system_type(resolved))
    return resolved


def resolve_shared_group(explicit: bool | None = None) -> bool:
    """Group mode (several users): explicit, else $CROSSOVER_LEASE_SHARED_GROUP ("1" on,
    "0" or unset off), so that a batch script or container spec can set it for every job
    beside CROSSOVER_LEASE_DIR."""
    if explicit is not None:
        if not isinstance(explicit, bool):
            raise ValueError(f"crossover lease shared_group must be a bool, got {explicit!r}")
        return explicit
    value = os.environ.get(SHARED_GROUP_ENV, "0")
    if value not in ("0", "1"):
        raise ValueError(f"${SHARED_GROUP_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


def segment_path(group: str, device_key: str,
                 lease_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """Where the lease's segment file lives."""
    return resolve_lease_dir(lease_dir) / (
        f"{SEGMENT_PREFIX}.{validate_name('group', group, GROUP_MAX_LEN)}."
        f"{validate_name('device key', device_key, DEVICE_KEY_MAX_LEN)}")


def unlink_segment(group: str, device_key: str,
                   lease_dir: str | os.PathLike | None = None) -> None:
    """Removes one lease's segment name; processes that have it open keep working."""
    segment_path(group, device_key, lease_dir).unlink(missing_ok=True)


@dataclasses.dataclass(frozen=True)
class SegmentFile:
    """One lease segment found in a lease directory."""
    group: str
    device_key: str
    path: pathlib.Path


def find_segments(lease_dir: str | os.PathLike | None = None,
                  group: str | None = None) -> list[SegmentFile]:
    """The lease segments in the directory (of one group if given), sorted by name; names that
    are not <prefix>.<group>.<device_key> with valid parts are ignored. Creates nothing."""
    directory = resolve_lease_dir(lease_dir)
    pattern = f"{SEGMENT_PREFIX}." + (
        f"{validate_name('group', group, GROUP_MAX_LEN)}.*" if group is not None else "*")
    found = []
    for path in sorted(directory.glob(pattern))[:_MAX_SEGMENTS]:
        parts = path.name.split(".")
        if (len(parts) == 3 and path.is_file() and _NAME_RE.fullmatch(parts[1])
                and _NAME_RE.fullmatch(parts[2])):
            found.append(SegmentFile(parts[1], parts[2], path))
    return found


def remove_group_segments(groups: Iterable[str],
                          lease_dir: str | os.PathLike | None = None) -> list[str]:
    """Unlinks every device's segment of each group (names validated, so no glob widening);
    processes that have a segment mapped keep working. Returns the removed paths."""
    removed = []
    for group in groups:
        for segment in find_segments(lease_dir, group):
            segment.path.unlink(missing_ok=True)
            removed.append(str(segment.path))
    return removed
