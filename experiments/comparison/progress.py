"""One line per finished trial (issue 63): a 40-minute comparison otherwise says nothing
between its scenarios, and whoever watches it cannot tell whether to wait or plan around it."""
from __future__ import annotations

import time
from typing import Callable, Sequence


class TrialProgress:
    """Prints, as each trial ends, its number of all, how long it and the trials so far took,
    and what is left at the mean trial's pace (trials of one comparison take about as long)."""

    def __init__(self, trials: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._trials, self._clock = trials, clock
        self._started = self._last = clock()
        self._done = 0

    def trial_done(self, order: Sequence[str]) -> None:
        """Records that a trial of these scenarios (in its order) ended, and says so."""
        now = self._clock()
        self._done += 1
        elapsed_s = now - self._started
        left_s = elapsed_s / self._done * (self._trials - self._done)
        print(f"Trial {self._done} of {self._trials} done ({', '.join(order)}) in "
              f"{(now - self._last) / 60:.1f} min; {elapsed_s / 60:.1f} min elapsed, about "
              f"{left_s / 60:.1f} min left", flush=True)
        self._last = now
