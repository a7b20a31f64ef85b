"""A file-system start barrier for the processes of jobs meant to run at the same time.

TensorFlow start-up and XLA compilation jitter by seconds, longer than a short benchmark run,
so "launched together" is not "trained together". Every process touches a file in a shared
directory and waits, bounded, until the expected number have arrived. A second barrier at the
end of warm-up (TimedStartBarrier) makes the jobs' timed phases start together too, whatever
their compile times: a comparison's concurrent window then covers their whole timed runs.
"""
from __future__ import annotations

import os
import pathlib
import time
from typing import Any

import keras


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


class TimedStartBarrier(keras.callbacks.Callback):
    """Waits at a barrier after `after_steps` training steps (the warm-up), between steps.

    Between steps the job holds no device (every step ends with a yield), and its link turn,
    if any, is left for the wait and joined again after it, so jobs still warming up never
    wait for one standing here. Place it before the step statistics among fit's callbacks:
    the wait then lands in the last warm-up step's time, never in a timed one. ``shift_s``
    delays this job's timed start past the barrier (the shift scenario's static shift), in
    the same place.
    """

    def __init__(self, spec: str, me: str, after_steps: int, strategy: Any,
                 timeout_s: float = 300.0, shift_s: float = 0.0):
        super().__init__()
        self.spec, self.me, self.after_steps = spec, me, after_steps
        self.strategy, self.timeout_s, self.shift_s = strategy, timeout_s, shift_s
        self._steps = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._steps += 1
        if self._steps != self.after_steps:
            return
        self.strategy.pause_link_turn()  # no-op without link turns
        wait_at_barrier(self.spec, self.me, self.timeout_s)
        if self.shift_s > 0:
            time.sleep(self.shift_s)
        self.strategy.resume_link_turn()  # not on a timeout: a failed job stays out of turns
