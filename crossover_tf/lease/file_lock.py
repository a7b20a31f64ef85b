"""A bounded wait for an exclusive flock: the op cache's build lock and the emulated cluster's
subnet lock both need one, and a plain blocking flock would hang behind a stuck holder.
The kernel drops a flock when its holder dies, so only a live holder can keep it."""
from __future__ import annotations

import fcntl
import os
import time
from typing import IO

POLL_S = 0.05
PROC_LOCKS = "/proc/locks"


def flock_within(file: int | IO, timeout_s: float, poll_s: float = POLL_S) -> bool:
    """Takes an exclusive flock on file (a descriptor or an open file), trying until
    timeout_s; False if another holder still has it then (each caller names its own error)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)


def flock_holder(fd: int, proc_locks: str = PROC_LOCKS) -> int | None:
    """The pid holding a flock on fd's file, from the kernel's table (not a pid written in the
    file, which whoever could open it may have chosen); None where it cannot be told. Where
    the table's device is not the one fstat reports (btrfs subvolumes, overlayfs in some
    containers) the holder cannot be told, and a waiter falls back to its bounded wait: an
    inode alone could name another file's holder and refuse wrongly."""
    st = os.fstat(fd)
    wanted = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    try:
        with open(proc_locks) as table:
            lines = table.read().splitlines()
    except OSError:
        return None
    for fields in (line.split() for line in lines):
        # "1: FLOCK  ADVISORY  WRITE <pid> <major>:<minor>:<inode> 0 EOF"; a waiter has "->"
        if len(fields) >= 6 and fields[1] == "FLOCK" and _file_id(fields[5]) == wanted:
            return int(fields[4]) if fields[4].isdigit() else None
    return None


def _file_id(text: str) -> tuple[int, int, int] | None:
    major, minor, inode = (text.split(":") + ["", ""])[:3]
    try:
        return int(major, 16), int(minor, 16), int(inode)
    except ValueError:
        return None
