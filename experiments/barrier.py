"""A file-system start barrier for the processes of jobs meant to run at the same time.

TensorFlow start-up and XLA compilation jitter by seconds, longer than a short benchmark run,
so "launched together" is not "trained together". Every process touches a file in a shared
directory and waits, bounded, until the expected number have arrived.
"""
from __future__ import annotations

import os
import pathlib
import time


def wait_at_barrier(spec: str, me: str, timeout_s: float = 300.0) -> None:
    """spec is 'DIR:COUNT'; me names this process (unique per barrier)."""
    directory, _, count = spec.rpartition(":")
    if not directory or not count.isdigit() or int(count) < 1:
        raise ValueError(f"start barrier must look like DIR:COUNT, got {spec!r}")
    pathlib.Path(directory).mkdir(parents=True, exist_ok=True)
    pathlib.Path(directory, me).touch()
    deadline = time.monotonic() + timeout_s
    while len(os.listdir(directory)) < int(count):
        if time.monotonic() > deadline:
            raise TimeoutError(f"start barrier {spec}: only {sorted(os.listdir(directory))} "
                               f"arrived within {timeout_s} s (did a peer job die?)")
        time.sleep(0.01)
