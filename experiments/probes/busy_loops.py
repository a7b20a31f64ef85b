"""Busy-loop processes that load the CPU for the duration of a block.

Why one helper: the comm-CPU probe spins one beside an allreduce (the compute of a co-located
job, without TensorFlow), and the slowed-baseline test crowds every core during a run. Each
loop ends by itself after `limit_s`, so a killed owner leaves no spinner behind.

Under the kernel's autogroup scheduling (sched_autogroup_enabled=1) CPU time is shared between
sessions first: loops in their owner's session compete inside its group, loops each in a
session of their own (`own_sessions`) weigh as separate processes against every other session,
such as the ranks the launcher starts (tests/multiprocess/test_slowed_baseline.py measured it).
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Iterator

MAX_BUSY_S = 600.0  # a busy loop ends by itself even if its owner is killed


@contextlib.contextmanager
def busy_loops(count: int, *, own_sessions: bool = False,
               limit_s: float = MAX_BUSY_S) -> Iterator[None]:
    """`count` processes spinning while the block runs (none for 0), each in a session of its
    own when `own_sessions`; they inherit this process's CPU affinity."""
    program = f"import time\nend = time.monotonic() + {limit_s}\nwhile time.monotonic() < end: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", program], start_new_session=own_sessions)
                for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()
