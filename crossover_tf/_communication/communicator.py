"""The runtime's one communication seam: what the strategy, the steps and the set-up ask of the
job's ranks, whatever library moves the bytes.

A Communicator has three primitives (a grouped allreduce, a broadcast, an object allgather)
and the ranks' coordinates; everything else the runtime needs (averaging a step's gradients,
broadcasting variables after checking every rank has the same ones, averaging metrics, a
barrier, agreeing on a minimum, tf.distribute's reduce) is built on them here, once. Only a
backend module implements the primitives (horovod.py: the only module of the runtime
that imports Horovod), so a second backend is one new module, not edits across the steps.

None of these may run while this process holds the device lease: the step protocol yields it
first (_protocol.step_protocol.StepProtocol, whose verbs every step runs).
"""
from __future__ import annotations

import abc
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from crossover_tf._nest import map_present

_REDUCE_OPS = {"sum": False, "mean": True}  # reduce op name -> mean?

# What averages a step's gradients over the job's ranks (the strategy's synchronize_gradients).
Allreduce = Callable[[Sequence[Any]], list[Any]]


class Communicator(abc.ABC):
    """The job's ranks, as the runtime sees them (one process per replica)."""

    @property
    @abc.abstractmethod
    def rank(self) -> int:
        """This process's rank in the job."""

    @property
    @abc.abstractmethod
    def size(self) -> int:
        """How many ranks (replicas) the job has."""

    @property
    @abc.abstractmethod
    def local_rank(self) -> int:
        """This process's rank among the job's ranks on its host."""

    @property
    @abc.abstractmethod
    def local_size(self) -> int:
        """How many of the job's ranks run on this host."""

    def start(self) -> None:
        """Connects the ranks, once the devices are configured (bring_up calls it before any
        collective). A backend whose connection initialises TensorFlow's runtime does it
        here, since GPUs cannot be pinned after that; others have nothing to do."""

    def own_devices(self, devices: Sequence[Any]) -> list[Any]:
        """The logical devices (tf.config.list_logical_devices) that are this process's own:
        a backend whose server makes its peers' devices visible leaves those out."""
        return list(devices)

    @abc.abstractmethod
    def allreduce(self, tensors: Sequence[tf.Tensor], *, mean: bool, name: str,
                  device: str | None = None, compress: bool = False) -> list[tf.Tensor]:
        """Sums (or averages) each tensor over the ranks, all in one grouped collective.
        device places the collective (None: next to the tensors); compress applies the
        backend's gradient compression, if it has one."""

    @abc.abstractmethod
    def broadcast(self, tensor: tf.Tensor, root_rank: int, name: str) -> tf.Tensor:
        """root_rank's tensor, on every rank."""

    @abc.abstractmethod
    def allgather_object(self, obj: Any, name: str) -> list[Any]:
        """Every rank's picklable obj, in rank order."""

    # ----- built on the primitives, the same for every backend --------------------------------
    def gather(self, obj: Any) -> list[Any]:
        """Every rank's obj, in rank order; no collective when the job has one rank."""
        return self.allgather_object(obj, "crossover_config_check") if self.size > 1 else [obj]

    def agree_on_min(self, value: int) -> int:
        """The smallest of every rank's value (the job's ranks agree on it)."""
        return min(self.gather(value))

    def barrier(self) -> None:
        """Returns once every rank of the job has called it (a tiny allgather)."""
        if self.size > 1:
            self.allgather_object(None, "crossover_barrier")

    def allreduce_gradients(self, grads: Sequence[tf.Tensor | tf.IndexedSlices | None],
                            device: str | None = None, mean: bool = True,
                            bucket_bytes: int = 0) -> list[tf.Tensor | None]:
        """Averages (mean=False: sums, as MultiWorkerMirroredStrategy's optimizer does)
        gradients over the ranks, compressed as the backend is set to; None stays None.

        bucket_bytes=0: one grouped (fused) allreduce of them all. Otherwise one grouped
        allreduce per bucket of about bucket_bytes, filled from the last gradient backwards
        (gradients_in_buckets): traced in a graph, each bucket's collective starts as soon as
        its own gradients exist, while the backward pass still computes the earlier layers'
        (what Horovod's tape gets from its per-tensor ops and fusion buffer). With two ranks the
        sums are the same either way, element by element; with more, the ring's or fusion
        buffer's layout, and so the order of a sum's terms, may differ in the last bits.

        Sparse gradients are densified: a grouped allreduce needs dense tensors, and for the
        models this project targets the dense path is what Horovod's sparse_as_dense would
        pick. With one rank there is nothing to reduce (the mean and the sum of one are
        itself) and no collective runs: under Horovod even one rank's allreduce waits for its
        background thread's next cycle, 6% of a 19 ms step here."""
        def reduce_all(present: list[Any]) -> list[tf.Tensor]:
            dense = [tf.convert_to_tensor(g) for g in present]
            if not dense or self.size == 1:
                return dense
            out: list[Any] = [None] * len(dense)
            for number, bucket in enumerate(self.gradient_buckets(dense, bucket_bytes)):
                reduced = self.allreduce([dense[i] for i in bucket], mean=mean,
                                         name=f"crossover_grads_{number}", device=device,
                                         compress=True)
                for i, r in zip(bucket, reduced):
                    out[i] = r
            return out

        return map_present(reduce_all, grads)

    def gradient_buckets(self, tensors: Sequence[tf.Tensor], bucket_bytes: int
                         ) -> list[list[int]]:
        """How allreduce_gradients splits the gradients into collectives: buckets of about
        bucket_bytes (gradients_in_buckets). A backend whose runtime fuses tensors itself as
        they come (Horovod) may submit each tensor alone instead."""
        return gradients_in_buckets(tensors, bucket_bytes)

    def broadcast_variables(self, variables: Sequence[Any], root_rank: int = 0) -> None:
        """Overwrites variables with root_rank's values (initial weights, optimizer state),
        after checking that every rank passes the same list (count, shapes, dtypes): a
        mismatch would otherwise hang in, or fail deep inside, the backend's broadcast."""
        variables = list(variables)
        self.check_same_variables(variables, root_rank)
        if not variables:
            return

        @tf.function
        def broadcast_all() -> None:
            for i, v in enumerate(variables):
                v.assign(self.broadcast(tf.convert_to_tensor(v), root_rank,
                                        f"crossover_bcast_{i}"))

        broadcast_all()

    def check_same_variables(self, variables: Sequence[Any], root_rank: int = 0) -> None:
        """Raises ValueError on every rank, naming the first variable where a rank's list
        differs from root_rank's (names may differ across ranks; shapes and dtypes may not)."""
        mine = [(_variable_name(v), tuple(v.shape), str(v.dtype)) for v in variables]
        everyone = self.allgather_object(mine, "crossover_variables_check")
        root = everyone[root_rank]
        for rank, theirs in enumerate(everyone):
            for i in range(max(len(root), len(theirs))):
                a = root[i] if i < len(root) else None
                b = theirs[i] if i < len(theirs) else None
                if a is None or b is None or a[1:] != b[1:]:
                    raise ValueError(
                        f"crossover_tf: cannot broadcast rank {root_rank}'s state: rank {rank} "
                        f"has {len(theirs)} variables, rank {root_rank} has {len(root)}; first "
                        f"mismatch at variable {i}: rank {root_rank} {_describe(a)}, rank "
                        f"{rank} {_describe(b)}. Build the same model and optimizer on every "
                        "rank.")

    def average_scalars(self, values: dict[str, float]) -> dict[str, float]:
        """Averages a dict of scalars (e.g. Keras logs) over the ranks, in a stable key order;
        other values pass through."""
        keys = sorted(k for k, v in values.items() if _is_scalar(v))
        if not keys:
            return dict(values)
        stacked = tf.constant([float(values[k]) for k in keys], tf.float64)
        (averaged,) = self.allreduce([stacked], mean=True, name="crossover_metric_average")
        return {**values, **{k: float(a) for k, a in zip(keys, averaged.numpy())}}

    def reduce(self, reduce_op: Any, value: Any, axis: int | None = None) -> Any:
        """tf.distribute's reduce: over the ranks, and first along axis locally."""
        mean = reduce_is_mean(reduce_op)

        def reduce_one(t: Any) -> tf.Tensor:
            t = tf.convert_to_tensor(t)
            if axis is not None:
                if not mean:
                    t = tf.reduce_sum(t, axis=axis)
                else:
                    # Mean over all ranks' elements: sum locally, divide by the global count.
                    total, count = self.allreduce(
                        [tf.reduce_sum(t, axis=axis), tf.cast(tf.shape(t)[axis], t.dtype)],
                        mean=False, name="crossover_reduce")
                    return total / count
            return self.allreduce([t], mean=mean, name="crossover_reduce")[0]

        return tf.nest.map_structure(reduce_one, value)


def gradients_in_buckets(tensors: Sequence[tf.Tensor], bucket_bytes: int) -> list[list[int]]:
    """Indices of tensors in buckets of at least bucket_bytes (the last may be smaller), from
    the last tensor backwards: a model's variables are listed input to output and its backward
    pass makes their gradients output to input, so the first bucket is complete first.
    bucket_bytes <= 0: one bucket of them all, in order. A tensor of unknown size counts as
    bucket_bytes (a bucket of its own)."""
    if bucket_bytes <= 0:
        return [list(range(len(tensors)))] if tensors else []
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in reversed(range(len(tensors))):
        t = tensors[i]
        elements = t.shape.num_elements()
        current.append(i)
        size += bucket_bytes if elements is None else elements * t.dtype.size
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def reduce_is_mean(reduce_op: Any) -> bool:
    """tf.distribute.ReduceOp or 'sum'/'mean' as mean? (True) or sum (False); anything else is
    a ValueError."""
    key = str(getattr(reduce_op, "value", reduce_op)).lower()
    if key not in _REDUCE_OPS:
        raise ValueError(f"unsupported reduce op {reduce_op!r}; use tf.distribute.ReduceOp.SUM "
                         "or MEAN (or 'sum' / 'mean')")
    return _REDUCE_OPS[key]


def _variable_name(variable: Any) -> str:
    return str(getattr(variable, "path", None) or variable.name)


def _describe(entry: tuple[str, tuple, str] | None) -> str:
    return "(none)" if entry is None else f"{entry[0]} shape={entry[1]} dtype={entry[2]}"


def _is_scalar(value: Any) -> bool:
    array = np.asarray(value)
    return array.ndim == 0 and np.issubdtype(array.dtype, np.number)
