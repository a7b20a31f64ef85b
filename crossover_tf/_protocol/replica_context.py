"""Inside strategy.run: the replica context and strategy that tf.distribute code asks for, so that
a MultiWorkerMirroredStrategy custom loop trains as it does there, with the strategy line changed.

Why: CrossoverStrategy is not a tf.distribute.Strategy (strategy.py says why), so inside its
run TensorFlow and Keras saw the default strategy: one replica. `get_replica_context()
.all_reduce(SUM, 1.0)` returned 1.0 on 2 ranks, `replica_id_in_sync_group` was 0 on every rank,
`tf.nn.compute_average_loss` divided by the local batch, and Keras's optimizer (which sums the
gradients through the replica context, as MultiWorkerMirroredStrategy's does) reduced nothing:
each rank trained alone while the reduced loss looked normal.

While strategy.run runs fn (in this thread), `tf.distribute.get_strategy()` and
`get_replica_context()` answer for the job: `num_replicas_in_sync` is the job's rank count (so
`compute_average_loss` and Keras's losses scale by the global batch), the replica id is the
rank, and `all_reduce` reduces over the ranks. The gradients the optimizer sums go through the
step protocol (the device yielded around the collective, the link turn taken), the same verbs
as the Keras step; other all_reduces are plain collectives, with the device yielded too. So an
unchanged tutorial loop gets MultiWorkerMirroredStrategy's sums: the same weights. Outside
run nothing changes: `has_strategy()` stays False in scope() (docs/using.md says why).

Only the calls tf.distribute code makes of a replica context are answered; `merge_call` and
other strategy methods inside run are refused by name, never silently wrong.
"""
from __future__ import annotations

import contextlib
import threading
import warnings
from typing import TYPE_CHECKING, Any, Iterator

import tensorflow as tf
from tensorflow.python.distribute import distribute_lib

from crossover_tf._communication.communicator import reduce_is_mean
from crossover_tf._hold.custom_loop import reduce_yielded

if TYPE_CHECKING:
    from crossover_tf._protocol.step_protocol import StepProtocol

_local = threading.local()
_ORIGINAL = {"get_strategy": distribute_lib.get_strategy,
             "get_replica_context": distribute_lib.get_replica_context}


def _stack() -> list["RunContext | None"]:
    if not hasattr(_local, "runs"):
        _local.runs = []
    return _local.runs


def current() -> "RunContext | None":
    """The strategy.run running in this thread (None outside every run, or suspended)."""
    runs = _stack()
    return runs[-1] if runs else None


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """tf.distribute's lookups answer as outside every run while inside."""
    _stack().append(None)
    try:
        yield
    finally:
        _stack().pop()


NESTED_HOLD = (
    "crossover_tf: strategy.hold_device() inside strategy.run is deprecated, and will be "
    "refused after this release: run already holds the device, so this hold holds nothing "
    "more, and its block runs as it would outside run (tf.distribute's replica context set "
    "aside: strategy.gradient_tape averages the gradients once and the optimizer applies "
    "them as given), training exactly as the same step without strategy.run. Replace it: "
    "drop strategy.run and call the step itself (hold_device and gradient_tape kept), or "
    "keep strategy.run and drop hold_device() and strategy.gradient_tape (a plain "
    "tf.GradientTape: the optimizer sums the gradients over the ranks; scale the loss with "
    "tf.nn.compute_average_loss or a Keras loss)")


def nested_hold() -> contextlib.AbstractContextManager[None]:
    """strategy.hold_device() inside strategy.run, as the custom loop of the 2026-12-04 docs
    ported into run writes it: a no-op hold (run's holds the device) whose block sees no
    replica context, so its gradient_tape reduces once and no Keras loss or optimizer counts
    the ranks again: the un-nested step's result, bit for bit. Deprecated for one release."""
    warnings.warn(NESTED_HOLD, DeprecationWarning, stacklevel=3)
    return suspended()


def _refused(what: str) -> AttributeError:
    return AttributeError(
        f"crossover_tf: {what} inside strategy.run is not supported: CrossoverStrategy answers "
        "tf.distribute's replica-context calls there (num_replicas_in_sync, "
        "replica_id_in_sync_group, all_reduce, all_gather) and nothing else "
        "(docs/coming_from_mirrored.md)")


class _Extended:
    """What tf.distribute's own helpers ask of `get_strategy().extended` inside a replica."""

    def _use_merge_call(self) -> bool:  # Keras's optimizer then updates without merge_call
        return False

    def __getattr__(self, name: str) -> Any:
        raise _refused(f"tf.distribute.get_strategy().extended.{name}")


class RunStrategy:
    """`tf.distribute.get_strategy()` inside strategy.run: the job's replica count."""

    def __init__(self, num_replicas: int):
        self.num_replicas_in_sync = num_replicas
        self.extended = _Extended()

    def __getattr__(self, name: str) -> Any:
        raise _refused(f"tf.distribute.get_strategy().{name}")


class RunContext:
    """`tf.distribute.get_replica_context()` inside strategy.run: this rank of the job."""

    def __init__(self, protocol: "StepProtocol"):
        self._protocol = protocol
        self.strategy = RunStrategy(protocol.comm.size)
        self._reducing_gradients = False

    @property
    def num_replicas_in_sync(self) -> int:
        return self._protocol.comm.size

    @property
    def replica_id_in_sync_group(self) -> int:
        return self._protocol.comm.rank

    @property
    def devices(self) -> tuple[str, ...]:
        return (self._protocol.device,)

    @contextlib.contextmanager
    def reducing_gradients(self) -> Iterator[None]:
        """The all_reduce inside is the optimizer's sum of the gradients (optimizer_guard)."""
        self._reducing_gradients, before = True, self._reducing_gradients
        try:
            yield
        finally:
            self._reducing_gradients = before

    def all_reduce(self, reduce_op: Any, value: Any, options: Any = None) -> Any:
        """value reduced over the job's ranks (SUM or MEAN), with the device yielded."""
        mean = reduce_is_mean(reduce_op)
        flat = [tf.convert_to_tensor(v) for v in tf.nest.flatten(value)]
        if self._reducing_gradients:
            reduced = reduce_yielded(
                flat, lambda ts, overlap, yielded: self._protocol.allreduce_gradients_in_turn(
                    ts, mean=mean, overlap=overlap, after=yielded))
        else:
            reduced = reduce_yielded(
                flat, lambda ts, *_: [self._protocol.comm.reduce(reduce_op, t) for t in ts])
        return tf.nest.pack_sequence_as(value, reduced)

    def all_gather(self, value: Any, axis: int, options: Any = None) -> Any:
        raise _refused("get_replica_context().all_gather")

    def merge_call(self, merge_fn: Any, args: Any = (), kwargs: Any = None) -> Any:
        """Only the optimizer's own, to update its variables once their gradients were summed
        over the ranks: one replica per process, so it runs as the default strategy's."""
        if not self._reducing_gradients:
            raise _refused("get_replica_context().merge_call")
        with suspended():
            return _ORIGINAL["get_replica_context"]().merge_call(merge_fn, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        raise _refused(f"get_replica_context().{name}")


def _get_strategy() -> Any:
    run = current()
    return run.strategy if run is not None else _ORIGINAL["get_strategy"]()


def _get_replica_context() -> Any:
    run = current()
    return run if run is not None else _ORIGINAL["get_replica_context"]()


def _install() -> None:
    """Routes tf.distribute's lookups through this module (once per process): outside every
    run they answer as before."""
    if distribute_lib.get_strategy is _get_strategy:
        return
    for module in (distribute_lib, tf.distribute):
        module.get_strategy = _get_strategy
        module.get_replica_context = _get_replica_context


@contextlib.contextmanager
def entered(protocol: "StepProtocol") -> Iterator[RunContext]:
    """This thread's tf.distribute lookups answer for the job while inside."""
    _install()
    run = RunContext(protocol)
    _stack().append(run)
    try:
        yield run
    finally:
        _stack().remove(run)
