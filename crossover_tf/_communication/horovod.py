"""Horovod as the job's communication backend (what backend="auto" picks in a rank of
horovodrun): the runtime's one import of Horovod (communicator.py says what a backend provides).

Only Horovod's TensorFlow ops are used (grouped_allreduce, broadcast, allgather_object):
horovod.keras does not support Keras 3 (horovod issue 4290).
"""
from __future__ import annotations

import contextlib
from typing import Any, Sequence

import horovod.tensorflow as hvd
import tensorflow as tf

from crossover_tf._communication.communicator import Communicator


class HorovodCommunicator(Communicator):
    """The job's ranks through Horovod (Gloo here; NCCL for GPU tensors where it was built).

    Args:
      compression: gradient compression (hvd.Compression.none, the default, or .fp16).
      init: call hvd.init(); with False, Horovod must already be initialised.
    """

    def __init__(self, compression: Any = None, init: bool = True) -> None:
        if init:
            hvd.init()
        elif not hvd.is_initialized():
            raise RuntimeError("crossover_tf: Horovod is not initialised; call hvd.init() first "
                               "or construct CrossoverStrategy with "
                               "CommunicationOptions(init_horovod=True)")
        self.compression = compression if compression is not None else hvd.Compression.none

    def __repr__(self) -> str:
        return f"HorovodCommunicator(rank={self.rank}, size={self.size})"

    @property
    def rank(self) -> int:
        return hvd.rank()

    @property
    def size(self) -> int:
        return hvd.size()

    @property
    def local_rank(self) -> int:
        return hvd.local_rank()

    @property
    def local_size(self) -> int:
        return hvd.local_size()

    def allreduce(self, tensors: Sequence[tf.Tensor], *, mean: bool, name: str,
                  device: str | None = None, compress: bool = False) -> list[tf.Tensor]:
        op = hvd.Average if mean else hvd.Sum
        # tf.device(None) would clear the caller's device scope (strategy.scope()): only an
        # explicit placement (the gradients' allreduce_device) replaces it.
        with tf.device(device) if device is not None else contextlib.nullcontext():
            if len(tensors) == 1 and not compress:  # a metric or a reduce: Horovod's own op
                return [hvd.allreduce(tensors[0], op=op, name=name)]
            return hvd.grouped_allreduce(
                list(tensors), op=op, name=name,
                compression=self.compression if compress else hvd.Compression.none)

    def gradient_buckets(self, tensors: Sequence[tf.Tensor], bucket_bytes: int
                         ) -> list[list[int]]:
        """Overlapping (bucket_bytes > 0), each gradient is its own allreduce, last first, as
        hvd.DistributedGradientTape submits them: Horovod's background thread fuses whatever
        is ready each cycle (its fusion buffer is the bucket). Grouped buckets were submitted
        late here: a bucket's op is ready only once all its gradients are, and the step's
        inter-op threads, busy with the backward pass, ran it at the pass's end (Horovod's
        timeline on the emulated cluster)."""
        if bucket_bytes <= 0:
            return super().gradient_buckets(tensors, bucket_bytes)
        return [[i] for i in reversed(range(len(tensors)))]

    def broadcast(self, tensor: tf.Tensor, root_rank: int, name: str) -> tf.Tensor:
        return hvd.broadcast(tensor, root_rank, name=name)

    def allgather_object(self, obj: Any, name: str) -> list[Any]:
        return hvd.allgather_object(obj, name=name)
