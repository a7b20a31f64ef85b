"""A file-system start barrier for the processes of jobs meant to run at the same time.

TensorFlow start-up and XLA compilation jitter by seconds, longer than a short benchmark run,
so "launched together" is not "trained together". Every process touches a file in a shared
directory and waits, bounded, until the expected number have arrived. A second barrier at the
end of warm-up (TimedStartBarrier) makes the jobs' timed phases start together too, whatever
their compile times: a comparison's concurrent window then covers their whole timed runs.
"""
from __future__ import annotations

import time
from typing import Any

import keras

from experiments.file_barrier import phase, wait_at_barrier

__all__ = ["TimedStartBarrier", "phase", "wait_at_barrier"]


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
