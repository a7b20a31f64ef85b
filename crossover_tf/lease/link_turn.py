"""LinkTurn: the jobs of a crossover group run their gradient allreduces one at a time.

Why: while one job computes, the other's allreduce has the network, so in a crossed pair the
two jobs' allreduces overlap only in part, and partly overlapping allreduces take longer
together than the same allreduces back to back (docs/measured_history.md has the figures).
The turn puts them back to back: job `position` runs its allreduce k as global turn
(offset + k, position), and every host goes through the turns in that order.

Safe by construction: the turn is a wait, never a hold. A rank waits, outside any collective
and without the device, only for turns that come before its own in one global order, so the
waits cannot form a cycle across hosts. A peer that died or left is not waited for, and a wait
is bounded (wait_s): the order is a schedule, never needed for correctness, so after the bound
the allreduce runs anyway and the skip is counted.

Joining is a collective of the job's own ranks: each reads the latest index that puts the
job's first turn before the next turn of every job already turning on its host, and all adopt
the smallest, so one job's ranks agree on its offset. A joining job thus goes first: the jobs
already turning wait at most for its agreement (a small allgather) and its first allreduce,
and it never waits for a peer that is
momentarily not stepping (at a barrier, say). The ranks read only once all of them have
arrived, and hold the others still while they agree (LinkTurn.join says why and how).

Priority classes (a primary and its secondaries) do not mix with turns: turns alternate
strictly, so a primary's allreduce k would wait for its secondary's k-1, pacing the primary to
the secondary.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from crossover_tf.lease.device_lease import (DeviceLease, decode_named_values, fields_as_floats,
                                             pass_through, validate_timeout)
from crossover_tf.lease.loader import load_library

MAX_LINK_TURN_JOBS = 8  # the C++ core's kMaxLinkTurnJobs (fewer than a group may have)
UNCONSTRAINED = 1 << 62  # the C++ core's kLinkTurnUnconstrained: nobody else turns here


def validate_link_turn(position: int, jobs: int) -> tuple[int, int]:
    """Checks a turn position early, with the same rule as the C++ side."""
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (position, jobs)) \
            or not 1 <= jobs <= MAX_LINK_TURN_JOBS or not 0 <= position < jobs:
        raise ValueError(f"crossover link turn: jobs must be in [1, {MAX_LINK_TURN_JOBS}] and "
                         f"position in [0, jobs), got position {position!r} of {jobs!r} jobs")
    return position, jobs


def validate_link_turn_priority(priority: str) -> str:
    """Refuses a lease priority other than "normal" for a job that takes link turns (see the
    module docstring: turns would pace a primary to its secondary)."""
    if priority != "normal":
        raise ValueError(
            f"crossover_tf: priority {priority!r} cannot be combined with link_turn: turns "
            "alternate strictly, so a primary's allreduce would wait for its secondary's and "
            "run at the secondary's pace. Use link_turn with priority='normal', or priority "
            "without link_turn.")
    return priority


@dataclasses.dataclass(frozen=True)
class LinkTurnStats:
    """This process's link turns so far."""
    turns: int
    waited: int     # turns that waited for another job's allreduce
    skipped: int    # turns taken when the wait bound passed (a paused peer)
    wait_s: float
    max_wait_s: float

    def as_dict(self) -> dict[str, float]:
        return fields_as_floats(self)


class LinkTurn:
    """This process's place in its group's allreduce order on one device's host.

    wait(tensors) goes between the gradients and their allreduce, done(tensors) after it; both
    pass their tensors through, like the lease's acquire and yield_device. agree maps this rank's
    proposed offset to the job's common one (a min over the job's ranks); barrier returns once
    every rank of the job has called it (both collectives; with one rank, nothing to wait for).
    """

    def __init__(self, lease: DeviceLease, position: int, jobs: int,
                 agree: Callable[[int], int], wait_s: float = 10.0,
                 barrier: Callable[[], None] = lambda: None):
        self.lease = lease
        self.position, self.jobs = validate_link_turn(position, jobs)
        self.wait_s = validate_timeout(wait_s)
        self._agree = agree
        self._barrier = barrier
        self._ops = load_library()
        self.joined = False   # taking turns now
        self._paused = False  # left for a pause of this fit; resume() joins again

    def __repr__(self) -> str:
        return f"LinkTurn(position={self.position}, jobs={self.jobs}, wait_s={self.wait_s:g})"

    def join(self) -> int:
        """Starts taking turns (a collective of the job's ranks); returns the agreed offset.

        The jobs already turning keep going while this job's ranks gather, so a proposal read
        before they are all there, or taken only once they agreed, is stale by as many turns
        as the others took meanwhile, and that many of our turns would come before their next
        one (they would wait for our whole run, not for one allreduce). Hence, in order:
        1. a barrier: the ranks reach the join seconds apart (compile, a rank-0 checkpoint);
        2. each rank reads its host's proposal and takes it at once, for this host alone: the
           others stop at their next turn (their allreduce needs this host too), so they cannot
           run ahead while we agree. Our ranks may hold different offsets for that moment, but
           take no turn in it;
        3. the ranks agree on the smallest proposal and take it: one offset on every host.
        If 3 fails (a rank died, Ctrl-C), this rank leaves rather than hold the others at 2.
        """
        self._barrier()
        proposal = int(self._ops.crossover_link_turn_join(position=self.position, jobs=self.jobs,
                                                          **self.lease.names))
        self._start(proposal)
        try:
            offset = self._start(int(self._agree(proposal)))
        except BaseException:
            self.leave()
            raise
        self.joined, self._paused = True, False
        return offset

    def _start(self, offset: int) -> int:
        """Takes turns from offset on (UNCONSTRAINED: nobody else turns here, so 0)."""
        offset = 0 if offset >= UNCONSTRAINED else offset
        # An explicit int64: a Python int converts to int32 where it fits, which the op's
        # eager fallback refuses when join runs inside a trace (a custom loop's first step).
        self._ops.crossover_link_turn_start(np.int64(offset), **self.lease.names)
        return offset

    def leave(self) -> None:
        """Stops taking turns: the other jobs no longer wait for this one. Also ends a pause:
        a later resume() is a no-op, so the next fit joins only at its first step (after its
        broadcast and compile), not at its first epoch's begin. Safe when not joined."""
        self._ops.crossover_link_turn_leave(**self.lease.names)
        self.joined = self._paused = False

    def pause(self) -> None:
        """Leaves for a pause between steps (validation, epoch end), if taking turns."""
        if self.joined:
            self.leave()
            self._paused = True

    def resume(self) -> None:
        """Joins again after pause() (a collective of the job's ranks); no-op otherwise."""
        if self._paused:
            self.join()

    def wait(self, tensors: Any) -> Any:
        return pass_through(self._ops.crossover_link_turn_wait, tensors, **self.lease.names,
                            wait_seconds=self.wait_s)

    def done(self, tensors: Any) -> Any:
        return pass_through(self._ops.crossover_link_turn_done, tensors, **self.lease.names)

    def timeline(self) -> np.ndarray:
        """[n, 4] int64: request_ns, start_ns, done_ns (0 = running), skipped; wall clock."""
        return np.asarray(self._ops.crossover_link_turn_timeline(**self.lease.names))

    def stats(self) -> LinkTurnStats:
        values, names = self._ops.crossover_link_turn_stats(**self.lease.names)
        return decode_named_values(LinkTurnStats, values, names)

