"""StepProtocol: one rank's whole crossing protocol, owned by one object.

A crossed step is `acquire -> compute -> yield -> [link turn: join on first use, wait] ->
allreduce -> [link turn: done] -> acquire -> apply -> yield`. The Keras train, test and
predict steps, the custom loop's hold and tape, and the callbacks all run it through the verbs
here, so each rule lives once: joining the link turn happens only in `join_link_turn` (a
custom loop that never ran a Keras first step joins on its first allreduce, with the device
yielded), leaving only in `leave` (lease.leaving), and no lower layer is handed a strategy
method to call back.

Made once per rank by _setup.bring_up (which says in what order its parts are made safe) and
frozen: the strategy's `extended` is this object, as tf.distribute keeps a strategy's
machinery behind `extended`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from crossover_tf import lease as lease_lib
from crossover_tf._communication.communicator import Communicator
from crossover_tf._hold.custom_loop import DeviceHold
from crossover_tf._hold.device_hold import run_holding_device
from crossover_tf._nest import map_present
from crossover_tf._protocol import gradient_sync, ownership
from crossover_tf.options import (CommunicationOptions, DeviceOptions, LeaseOptions,
                                  LinkTurnOptions)


@dataclasses.dataclass(frozen=True, eq=False)
class StepProtocol:
    """One rank's crossover state and the verbs of its step protocol.

    Attributes:
      group, lease_options, link_turn_options, device_options, communication: as given.
      comm: the job's ranks (_communication.communicator.Communicator).
      device_key: this rank's device on its host (the lease's key).
      device: the TensorFlow device this rank's ops go on.
      allreduce_device: where the gradient allreduce runs (None: next to the gradients).
      lease: the device lease (None without a group: plain data parallelism).
      link_turn: the link turn (None without link turns).
      members: the jobs found on the lease when this job joined it.
    """
    group: str
    lease_options: LeaseOptions
    link_turn_options: LinkTurnOptions | None
    device_options: DeviceOptions
    communication: CommunicationOptions
    comm: Communicator
    device_key: str
    device: str
    allreduce_device: str | None
    lease: lease_lib.DeviceLease | None
    link_turn: lease_lib.LinkTurn | None
    members: tuple[Any, ...]

    def __repr__(self) -> str:
        return (f"StepProtocol(group={self.group!r}, device={self.device!r}, "
                f"lease={self.lease!r}, link_turn={self.link_turn!r})")

    @property
    def is_crossover(self) -> bool:
        """True with a crossover group: steps take the device lease."""
        return self.lease is not None

    @property
    def step_end_reserve_s(self) -> float:
        """The step-end yield's reservation against lower priority classes (a primary's)."""
        return self.lease_options.step_end_reserve_s

    # ----- holding the device ----------------------------------------------------------------
    def hold(self, tag: int, part: Callable[..., Any], *args: Any,
             step_end: bool = False) -> Any:
        """part(*args) computed with the device held (acquire -> part -> yield); step_end:
        the step's last hold, whose yield keeps the primary's reservation."""
        return run_holding_device(self.lease, tag, part, *args,
                                  reserve_s=self.step_end_reserve_s if step_end else 0.0)

    def device_hold(self) -> DeviceHold:
        """The custom loop's `with` hold around a whole step (strategy.hold_device())."""
        return DeviceHold(self.lease, self.step_end_reserve_s)

    # ----- the allreduce ---------------------------------------------------------------------
    def allreduce_gradients(self, grads: Sequence[Any], mean: bool = True,
                            bucket_bytes: int = 0) -> list[Any]:
        """Averages (mean=False: sums) gradients over the job's ranks (bucket_bytes=0: one
        grouped allreduce; else in buckets, Communicator.allreduce_gradients; None stays None),
        and notes that this step synchronised its gradients (gradient_sync: an optimizer update
        without it is refused). A collective: call it with the device yielded, or as
        allreduce_gradients_in_turn(overlap=True) says."""
        gradient_sync.note_synchronized(self)
        return self.comm.allreduce_gradients(grads, self.allreduce_device, mean, bucket_bytes)

    def allreduce_gradients_in_turn(self, grads: Sequence[Any], mean: bool = True,
                                    overlap: bool = False, after: Any = None) -> list[Any]:
        """allreduce_gradients, after the other jobs' earlier allreduces when the job takes
        link turns (joining them on first use). The Keras step, the custom loop's tape and the
        optimizer's reduction inside strategy.run call it between their yield and re-acquire,
        so the join, a collective of the job's ranks, never runs with the device held.

        overlap (a traced custom-loop step, _hold.custom_loop.reduce_yielded): the buckets of
        CommunicationOptions.bucket_bytes, each free to start once its gradients exist, while
        the backward pass still runs with the device held: the collectives run on the
        backend's threads, the step's own threads keep computing, and the device is yielded
        when the backward pass ends whatever the network's state. With link turns, the turn's
        wait gates every bucket and waits for `after` (the mid-step yield) too: it is a
        blocking kernel, and one that blocked while the device was held (run inline on the
        thread of the backward pass, as TensorFlow runs a cheap or a GPU kernel) would hold the
        device idle until the peer's turn ended. So under link turns the buckets start once the
        device is yielded and the turn is this job's; without them, during the backward pass."""
        bucket_bytes = self.communication.bucket_bytes if overlap else 0
        link_turn = self.link_turn
        if link_turn is None:
            return self.allreduce_gradients(grads, mean, bucket_bytes)
        with tf.init_scope():  # traced in a tf.function: join now, eagerly, not in the graph
            if not link_turn.joined:
                self.join_link_turn()
        with tf.control_dependencies([] if after is None else [after]):
            grads = (_gated(link_turn.wait, list(grads)) if bucket_bytes
                     else map_present(link_turn.wait, list(grads)))
        return map_present(link_turn.done, self.allreduce_gradients(grads, mean, bucket_bytes))

    # ----- the link turn's life --------------------------------------------------------------
    def join_link_turn(self) -> None:
        """Starts taking link turns (a collective of the job's ranks; no-op without them):
        the Keras first step calls it after its broadcast and compile, and the allreduce in
        turn on first use. The one place a job joins. A no-op while joined: train_on_batch
        prepares every call, and joining again would re-agree the job's offset each step."""
        if self.link_turn is not None and not self.link_turn.joined:
            self.link_turn.join()

    def pause_link_turn(self) -> None:
        """Leaves the link turn for a pause between steps (validation, an epoch's end, a
        barrier), if taking turns; resume_link_turn joins again."""
        if self.link_turn is not None:
            self.link_turn.pause()

    def resume_link_turn(self) -> None:
        """Joins again after pause_link_turn (a collective of the job's ranks); else no-op."""
        if self.link_turn is not None:
            self.link_turn.resume()

    def leave(self) -> None:
        """Leaves the link turn and gives up the device, for good (lease.leaving)."""
        lease_lib.leave(self.lease, self.link_turn)

    @property
    def should_checkpoint(self) -> bool:
        """Whether this rank saves checkpoints: rank 0 alone, as tf.distribute's
        `extended.should_checkpoint` answers on a multi-worker job's chief (the ranks hold the
        same weights)."""
        return self.comm.rank == 0

    @property
    def should_save_summary(self) -> bool:
        """Whether this rank writes summaries (TensorBoard): rank 0 alone, as tf.distribute's
        `extended.should_save_summary`, so a run is not written once per rank."""
        return self.comm.rank == 0

    def variable_created_in_scope(self, v: Any) -> bool:
        """Whether v was made inside this rank's strategy.scope(), as tf.distribute's
        `extended.variable_created_in_scope` answers (ownership records them)."""
        return ownership.owner_of_variables([v]) is self

    # ----- state and logs across the job's ranks ---------------------------------------------
    def broadcast_variables(self, variables: Sequence[Any], root_rank: int = 0) -> None:
        """Overwrites variables on every rank with root_rank's values (a collective)."""
        self.comm.broadcast_variables(variables, root_rank)

    def broadcast_state(self, variables: Sequence[Any]) -> None:
        """Rank 0's values on every rank before training (nothing to do with one rank)."""
        if self.comm.size > 1:
            self.broadcast_variables(variables, 0)

    def average_logs(self, logs: dict[str, Any]) -> dict[str, Any]:
        """Scalars averaged over the job's ranks (as they are, with one rank)."""
        return self.comm.average_scalars(logs) if self.comm.size > 1 else dict(logs)

    # ----- what the job recorded -------------------------------------------------------------
    def lease_stats(self) -> dict[str, float]:
        return self.lease.stats().as_dict() if self.lease is not None else {}

    def link_turn_stats(self) -> dict[str, float]:
        return self.link_turn.stats().as_dict() if self.link_turn is not None else {}

    def lease_timeline(self) -> np.ndarray | None:
        return self.lease.timeline() if self.lease is not None else None

    def link_turn_timeline(self) -> np.ndarray | None:
        return self.link_turn.timeline() if self.link_turn is not None else None


def _gated(wait: Callable[[list[Any]], list[Any]], grads: list[Any]) -> list[Any]:
    """grads, each made to wait (a control dependency) for wait() on the last present one: the
    first the backward pass makes. Gating each gradient apart keeps the buckets free to start
    one by one once the wait returns."""
    present = [g for g in grads if g is not None]
    if not present:
        return grads
    gate = wait([present[-1]])[0]
    with tf.control_dependencies([gate]):
        return [None if g is None else tf.identity(g) for g in grads]
