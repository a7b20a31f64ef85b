"""Where device-lease segments live, and their names, without TensorFlow.

One rule for group and device-key names (the C++ op enforces the same), one place that resolves
and checks the lease directory and spells the segment path: the op wrapper, the status command,
launchers' cleanup and tests all use these. Who may write the directory (the trust rule) is the
C++ core's to check, on every open (ops/core/lease_dir.h): Python never opens a segment to use it.

The directory is `lease_dir` if given, else $CROSSOVER_LEASE_DIR, else /dev/shm. Containers and
Slurm's job_container/tmpfs give each job its own /dev/shm, so jobs that must take turns on one
device name a directory they share. It must be on a file system known to be local: the lease's
futex and file locks do not work across hosts, so any other (network, cluster, FUSE, unknown) is
refused.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import fcntl
import os
import pathlib
import re
import stat as statmod
import time
from typing import Iterable

from crossover_tf.lease.trusted_path import MAX_LINKS, owner_text, resolve_components

DEFAULT_LEASE_DIR = pathlib.Path("/dev/shm")
LEASE_DIR_ENV = "CROSSOVER_LEASE_DIR"
SHARED_GROUP_ENV = "CROSSOVER_LEASE_SHARED_GROUP"  # group mode for every job of a script
SEGMENT_PREFIX = "crossover"  # the C++ op names segments <dir>/crossover.<group>.<device>
GROUP_MAX_LEN, DEVICE_KEY_MAX_LEN = 64, 32
_NAME_RE = re.compile(r"[A-Za-z0-9_-]+")  # whole name: fullmatch, so no "\n" slips past $
MAX_SEGMENTS = 1000  # bound on how many segments one cleanup or status touches

# statfs f_type values the lease knows, and whether each keeps shared mappings, futexes and file
# locks coherent among one host's processes: the C++ core's table (kFileSystems in
# ops/core/lease_dir.cc; tests/multiprocess/test_lease_trust.py checks they agree). Only the
# local ones are accepted, an allowlist: a lease on a network or cluster file system would
# silently exclude nobody on another host, and on FUSE its locks depend on the daemon. The
# others are listed to name them in the refusal.
FILE_SYSTEMS = {
    0x01021994: ("tmpfs", True), 0x858458F6: ("ramfs", True),
    0xEF53: ("ext2/ext3/ext4", True), 0x58465342: ("xfs", True), 0x9123683E: ("btrfs", True),
    0x2FC12FC1: ("zfs", True), 0xF2F52010: ("f2fs", True), 0x794C7630: ("overlayfs", True),
    0x6969: ("nfs", False), 0x517B: ("smb", False), 0xFF534D42: ("cifs", False),
    0xFE534D42: ("smb2", False), 0x01021997: ("9p", False), 0x00C36400: ("ceph", False),
    0x65735546: ("fuse", False), 0x5346414F: ("afs", False), 0x73757245: ("coda", False),
    0x0BD00BD0: ("lustre", False), 0x47504653: ("gpfs", False), 0x01161970: ("gfs2", False),
    0x7461636F: ("ocfs2", False), 0x19830326: ("beegfs", False), 0x20030528: ("panfs", False),
    0x7B7B7B7B: ("fhgfs/beegfs", False),
}
LOCAL_FILE_SYSTEMS = {magic: name for magic, (name, local) in FILE_SYSTEMS.items() if local}


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
    """Raises LeaseDirError, naming path and its type, unless f_type is a file system known to
    be local."""
    if f_type not in LOCAL_FILE_SYSTEMS:
        name = FILE_SYSTEMS.get(f_type, ("an unknown type", False))[0]
        raise LeaseDirError(
            f"crossover lease directory {path} is on {name} ({f_type:#x}), not a file system "
            f"known to be local ({', '.join(sorted(set(LOCAL_FILE_SYSTEMS.values())))}): the "
            "lease's futex and file locks must be coherent among the host's processes, and on a "
            "network or cluster file system jobs that share this directory from two hosts would "
            "compute at once without an error. Use a directory on a local file system of this "
            "host that every job of the group on it sees (a tmpfs such as /dev/shm, or a local "
            "disk)")


def _resolve_trusted_links(directory: pathlib.Path, shown: str, observer: bool
                           ) -> pathlib.Path | None:
    """directory with its links resolved one component at a time, following a link only if
    root or this user owns it (an observer: also the owner of the directory holding it), the C++
    core's rule (ops/core/lease_dir.h). A link anyone else owns could be re-pointed between two
    jobs' resolutions, putting them on two directories: two holders at once. So it is refused,
    never followed, whatever it points at now. None where a component is missing."""
    me = os.geteuid()

    def visit(parent: pathlib.Path, candidate: pathlib.Path, st: os.stat_result,
              links: int) -> None:
        if not statmod.S_ISLNK(st.st_mode):
            return
        trusted = {0, me} | ({os.lstat(parent).st_uid} if observer else set())
        if st.st_uid not in trusted:
            raise LeaseDirError(
                f"crossover lease directory {shown}: {candidate} is a symbolic link owned by "
                f"{owner_text(st.st_uid)}, who is neither root nor this job's user "
                f"({owner_text(me)}): its owner could point it at another directory between "
                "two jobs' opens, and the group's jobs would hold two leases (two holders at "
                "once). Name the directory itself, not the link (docs/deploying.md, \"Who may "
                "write the lease directory\")")
        if links > MAX_LINKS:
            raise LeaseDirError(f"crossover lease directory {shown}: more than {MAX_LINKS} "
                                "symbolic links on its path (a loop?)")

    return resolve_components(directory, visit)


def resolve_lease_dir(explicit: str | os.PathLike | None = None, *,
                      observer: bool = False) -> pathlib.Path:
    """The lease directory: explicit, else $CROSSOVER_LEASE_DIR, else /dev/shm; resolved to an
    absolute path and checked (it exists, is a directory, is on a local file system, and no
    link on its path belongs to another user; observer: status and the exporter, which read
    every user's leases and also follow a link of the directory owner's)."""
    chosen = explicit if explicit not in (None, "") else os.environ.get(LEASE_DIR_ENV) or None
    directory = pathlib.Path(chosen) if chosen is not None else DEFAULT_LEASE_DIR
    source = "" if explicit not in (None, "") or chosen is None else f" (from ${LEASE_DIR_ENV})"
    try:
        resolved = _resolve_trusted_links(directory, f"{directory}{source}", observer)
    except (FileNotFoundError, NotADirectoryError):
        resolved = None
    if resolved is None or not resolved.exists():
        raise LeaseDirError(f"crossover lease directory {directory}{source} does not exist: "
                            "create it (it must be the same directory for every job of the "
                            "group on this host)")
    if not resolved.is_dir():
        raise LeaseDirError(f"crossover lease directory {directory}{source} is not a directory")
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
                   lease_dir: str | os.PathLike | None = None) -> bool:
    """Removes one lease's segment if it is this user's and nobody is live on it (see
    remove_if_unused); True if it was removed."""
    return remove_if_unused(segment_path(group, device_key, lease_dir))


@dataclasses.dataclass(frozen=True)
class SegmentFile:
    """One lease segment found in a lease directory."""
    group: str
    device_key: str
    path: pathlib.Path


@dataclasses.dataclass(frozen=True)
class SegmentListing:
    """The segment names of a lease directory: the first MAX_SEGMENTS, those that may be real
    leases first, in turns by owner (see scan_segments), and how many more there were
    (planted names must not hide real leases silently). The first `real` of `found` may be
    leases; `untrusted` counts every name that cannot be one (it fails the trust rule by its
    lstat alone), listed or not, so that planted names are counted apart from leases.
    complete is False when the listing stopped at its deadline: names past that point were
    not seen."""
    found: list[SegmentFile]
    not_shown: int
    real: int = 0
    untrusted: int = 0
    complete: bool = True

    @property
    def real_not_shown(self) -> int:
        """Names that may be leases, past the first MAX_SEGMENTS."""
        return self.not_shown - (self.untrusted - (len(self.found) - self.real))


def _may_be_a_lease(st: os.stat_result, directory_gid: int) -> bool:
    """Whether an lstat could be a live lease's segment: a regular file, not empty, and private
    to its owner (0600) or the directory group's 0660 (group mode), as the trust rule asks
    (ops/core/lease_dir.cc CheckSegmentTrust). Anyone may create empty or 0666 names in a
    sticky shared directory; a real segment is neither."""
    bits = st.st_mode & 0o7777
    return (statmod.S_ISREG(st.st_mode) and st.st_size > 0
            and (bits & 0o077 == 0 or (bits == 0o660 and st.st_gid == directory_gid)))


# A name of the listing: (cannot be a lease, its owner's uid or its turn, name, group, device
# key).
_Name = tuple[bool, int, str, str, str]


def _in_owner_turns(names: list[_Name]) -> list[_Name]:
    """names in reading order, as (cannot, turn, name, group, device key): those that may be
    leases first, in turns by owner (every owner's first name by name order, then every
    owner's second, ...), then the others by name. Anyone may plant names that pass the trust
    rule by their lstat in a sticky shared directory (one-byte 0600 files, forged segments
    with live members: theirs to make), but only in their own turns: another user's lease
    stays among the first MAX_SEGMENTS read, and the exporter's member budget, spent in this
    order, reaches it. An owner's share is capped only by the others' turns, so one user
    alone may still fill the listing."""
    turns: dict[int, int] = {}
    ordered = []
    for cannot, owner, name, group, key in sorted(names, key=lambda n: (n[1], n[2])):
        turn = 0 if cannot else turns.get(owner, 0)
        if not cannot:
            turns[owner] = turn + 1
        ordered.append((cannot, turn, name, group, key))
    ordered.sort()
    return ordered


def scan_segments(lease_dir: str | os.PathLike | None = None,
                  group: str | None = None, deadline: float | None = None) -> SegmentListing:
    """The lease segment names in the directory (of one group if given): those that may be
    real leases first, in turns by owner (_in_owner_turns), then the others in name order, so
    names planted to sort first (empty or 0666 files, or another user's files that pass the
    trust rule by their lstat) cannot push a real lease past MAX_SEGMENTS. Names that are not
    <prefix>.<group>.<device_key> with valid parts, and entries that are not regular files (by
    the directory's own type, never following a link), are ignored. Opens and creates
    nothing: each name costs one lstat. With a deadline (time.monotonic()), the listing stops
    there (complete False): a directory of millions of names cannot stall its reader."""
    directory = resolve_lease_dir(lease_dir)
    if group is not None:
        validate_name("group", group, GROUP_MAX_LEN)
    directory_gid = os.stat(directory).st_gid
    names, complete = [], True
    with os.scandir(directory) as entries:
        for index, entry in enumerate(entries):
            if (deadline is not None and index % 256 == 0
                    and time.monotonic() >= deadline):
                complete = False
                break
            parts = entry.name.split(".")
            if (len(parts) == 3 and parts[0] == SEGMENT_PREFIX and _NAME_RE.fullmatch(parts[1])
                    and _NAME_RE.fullmatch(parts[2]) and (group is None or parts[1] == group)
                    and entry.is_file(follow_symlinks=False)):
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:  # removed meanwhile
                    continue
                names.append((not _may_be_a_lease(st, directory_gid), st.st_uid, entry.name,
                              parts[1], parts[2]))
    untrusted = sum(1 for cannot, *_ in names if cannot)
    found = _in_owner_turns(names)[:MAX_SEGMENTS]
    return SegmentListing([SegmentFile(g, key, directory / name) for *_, name, g, key in found],
                          max(0, len(names) - MAX_SEGMENTS),
                          real=sum(1 for cannot, *_ in found if not cannot),
                          untrusted=untrusted, complete=complete)


def find_segments(lease_dir: str | os.PathLike | None = None,
                  group: str | None = None) -> list[SegmentFile]:
    """The first MAX_SEGMENTS segments of scan_segments."""
    return scan_segments(lease_dir, group).found


class _Flock(ctypes.Structure):
    """struct flock, for F_OFD_GETLK (Python's fcntl.lockf cannot test a lock)."""
    _fields_ = [("l_type", ctypes.c_short), ("l_whence", ctypes.c_short),
                ("l_start", ctypes.c_int64), ("l_len", ctypes.c_int64), ("l_pid", ctypes.c_int)]


def _locked_by_anyone(fd: int) -> bool:
    """Whether any open file description holds a lock on any byte of the file: every member
    holds its presence and slot bytes until it exits (ops/core/lease_liveness.h)."""
    probe = _Flock(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)  # the whole file
    answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, bytes(probe))
    return _Flock.from_buffer_copy(answer).l_type != fcntl.F_UNLCK


def remove_if_unused(path: str | os.PathLike) -> bool:
    """Removes the segment at path only if it is a regular file of this user and no process is
    live on it, under the flock that guards its creation (as the core's last member out does);
    True if it was removed. Another user's segment, or one in use, is never touched."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not statmod.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # being created or repaired, or removed by its last member right now
            return False
        named = os.lstat(path)
        if _locked_by_anyone(fd) or (named.st_ino, named.st_dev) != (st.st_ino, st.st_dev):
            return False
        os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def remove_group_segments(groups: Iterable[str],
                          lease_dir: str | os.PathLike | None = None) -> list[str]:
    """Removes every device's segment of each group that this user owns and no process is live
    on (names validated, so no glob widening); a live one is left to its last member, which
    removes it at exit, and another user's is never touched. Returns the removed paths."""
    return [str(segment.path) for group in groups
            for segment in find_segments(lease_dir, group) if remove_if_unused(segment.path)]
