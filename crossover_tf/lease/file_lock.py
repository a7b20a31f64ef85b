"""A bounded wait for an exclusive flock: the op cache's build lock and the emulated cluster's
subnet lock both need one, and a plain blocking flock would hang behind a stuck holder.
The kernel drops a flock when its holder dies, so only a live holder can keep it."""
from __future__ import annotations

import fcntl
import time
from typing import IO

POLL_S = 0.05


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
