"""The file-system barrier itself, without Keras: experiments/barrier.py's wait_at_barrier and
phase, importable by a process that must not load Keras 3 (a plain Horovod rank on tf_keras,
benchmarks/horovod_port_worker.py)."""
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


def phase(spec: str, name: str) -> str:
    """The barrier of one phase (e.g. "start", "timed") of spec 'DIR:COUNT': its own
    sub-directory, so one DIR holds every phase of a run and is cleaned up as one."""
    directory, _, count = spec.rpartition(":")
    return f"{pathlib.Path(directory, name)}:{count}"
