"""Horovod collectives the strategy uses, each written once.

Only Horovod's TensorFlow ops (allreduce, grouped_allreduce, broadcast, allgather_object) are
used: horovod.keras does not support Keras 3. None of these may run while this process holds
the device lease; the train step releases it first (see train_step.CrossoverTrainStep).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

_REDUCE_OPS = {"sum": hvd.Sum, "mean": hvd.Average}


def horovod_reduce_op(reduce_op: Any) -> Any:
    """Maps tf.distribute.ReduceOp or 'sum'/'mean' to Horovod's op; rejects anything else."""
    name = getattr(reduce_op, "value", reduce_op)
    key = str(name).lower()
    if key not in _REDUCE_OPS:
        raise ValueError(f"unsupported reduce op {reduce_op!r}; use tf.distribute.ReduceOp.SUM "
                         "or MEAN (or 'sum' / 'mean')")
    return _REDUCE_OPS[key]


def allreduce_gradients(grads: Sequence[tf.Tensor | tf.IndexedSlices | None],
                        compression: Any = hvd.Compression.none,
                        device: str | None = None) -> list[tf.Tensor | None]:
    """Averages gradients over all ranks in one grouped (fused) allreduce; None stays None.

    Sparse gradients are densified: a grouped allreduce needs dense tensors, and for the
    models this project targets the dense path is what Horovod's sparse_as_dense would pick.
    device places the allreduce op ("/CPU:0": Gloo on host memory, whatever the gradients'
    device; None: where the gradients are, i.e. NCCL for GPU tensors when Horovod has it).
    """
    def reduce_all(dense: list[Any]) -> list[tf.Tensor]:
        dense = [tf.convert_to_tensor(g) for g in dense]
        if not dense:
            return []
        with tf.device(device):
            return hvd.grouped_allreduce(dense, op=hvd.Average, compression=compression,
                                         name="crossover_grads")

    return map_present(reduce_all, grads)


def map_present(op: Callable[[list[Any]], Sequence[Any]],
                items: Sequence[Any | None]) -> list[Any | None]:
    """Applies a list-to-list op to the non-None items, keeping None in place (variables
    without gradients pass through collectives and lease ops untouched)."""
    present = [i for i, item in enumerate(items) if item is not None]
    out = list(items)
    for i, result in zip(present, op([items[i] for i in present])):
        out[i] = result
    return out


def broadcast_variables(variables: Sequence[Any], root_rank: int = 0) -> None:
    """Overwrites variables with root_rank's values (initial weights, optimizer state).

    Checks first that every rank passes the same list (count, shapes, dtypes): a mismatch
    would otherwise hang in, or fail deep inside, Horovod's broadcast.
    """
    variables = list(variables)
    check_same_variables(variables, root_rank)
    if not variables:
        return

    @tf.function
    def broadcast_all() -> None:
        for i, v in enumerate(variables):
            v.assign(hvd.broadcast(tf.convert_to_tensor(v), root_rank, name=f"crossover_bcast_{i}"))

    broadcast_all()


def check_same_variables(variables: Sequence[Any], root_rank: int = 0) -> None:
    """Raises ValueError on every rank, naming the first variable where a rank's list differs
    from root_rank's (names may differ across ranks; shapes and dtypes may not)."""
    mine = [(_variable_name(v), tuple(v.shape), str(v.dtype)) for v in variables]
    everyone = hvd.allgather_object(mine, name="crossover_variables_check")
    root = everyone[root_rank]
    for rank, theirs in enumerate(everyone):
        for i in range(max(len(root), len(theirs))):
            a = root[i] if i < len(root) else None
            b = theirs[i] if i < len(theirs) else None
            if a is None or b is None or a[1:] != b[1:]:
                raise ValueError(
                    f"crossover_tf: cannot broadcast rank {root_rank}'s state: rank {rank} has "
                    f"{len(theirs)} variables, rank {root_rank} has {len(root)}; first mismatch "
                    f"at variable {i}: rank {root_rank} {_describe(a)}, rank {rank} "
                    f"{_describe(b)}. Build the same model and optimizer on every rank.")


def _variable_name(variable: Any) -> str:
    return str(getattr(variable, "path", None) or variable.name)


def _describe(entry: tuple[str, tuple, str] | None) -> str:
    return "(none)" if entry is None else f"{entry[0]} shape={entry[1]} dtype={entry[2]}"


def average_scalars(values: dict[str, float]) -> dict[str, float]:
    """Averages a dict of scalars (e.g. Keras logs) across ranks, in a stable key order."""
    keys = sorted(k for k, v in values.items() if _is_scalar(v))
    if not keys:
        return dict(values)
    stacked = tf.constant([float(values[k]) for k in keys], tf.float64)
    averaged = hvd.allreduce(stacked, op=hvd.Average, name="crossover_metric_average").numpy()
    return {**values, **{k: float(a) for k, a in zip(keys, averaged)}}


def _is_scalar(value: Any) -> bool:
    array = np.asarray(value)
    return array.ndim == 0 and np.issubdtype(array.dtype, np.number)


def allgather_objects(obj: Any) -> list[Any]:
    """Every rank's obj, in rank order (for configuration consistency checks)."""
    return hvd.allgather_object(obj, name="crossover_config_check")


def barrier() -> None:
    """Returns once every rank has called it (a tiny allgather: Horovod's TensorFlow API has
    no barrier)."""
    hvd.allgather_object(None, name="crossover_barrier")


# What averages a step's gradients over the job's ranks (the strategy's synchronize_gradients).
Allreduce = Callable[[Sequence[Any]], list[Any]]


def allreduce_in_turn(allreduce: Allreduce, turn: Any, grads: list[Any]) -> list[Any]:
    """allreduce(grads), after the other jobs' earlier allreduces when the job takes link
    turns (`turn`, a LinkTurn; None: as they come). The Keras step and the custom-loop tape
    both run their gradient allreduce through here."""
    if turn is None:
        return allreduce(grads)
    grads = map_present(turn.wait, grads)
    return map_present(turn.done, allreduce(grads))
