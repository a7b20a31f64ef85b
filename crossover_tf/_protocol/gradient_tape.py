"""strategy.gradient_tape(tape): the custom loop's allreduce, as hvd.DistributedGradientTape.

Its gradient() runs the middle of the step protocol inside the loop's hold
(`_hold/custom_loop.DeviceHold`): yield -> allreduce in the job's link turn -> re-acquire, the
same verbs as the Keras train step (StepProtocol.allreduce_gradients_in_turn). Traced, the
allreduce goes in buckets that start while the backward pass runs, as Horovod's tape's do
(custom_loop.reduce_yielded).
"""
from __future__ import annotations

from typing import Any, Mapping

import tensorflow as tf

from crossover_tf._hold.custom_loop import innermost_hold, reduce_yielded
from crossover_tf._protocol.optimizer_guard import refuse_inside_run
from crossover_tf._protocol.step_protocol import StepProtocol
from crossover_tf.options import CommunicationOptions, resolve_backend

# hvd.DistributedGradientTape's options this tape does not take, and why: a port that passes
# one is told, never silently given something else.
NOT_TAKEN = {
    "device_dense": "the allreduce runs where CommunicationOptions(allreduce_on=...) puts it",
    "device_sparse": "sparse gradients are densified, as sparse_as_dense=True does",
    "gradient_predivide_factor": "the gradients are averaged in one step, as op=hvd.Average",
    "num_groups": "the gradients go in buckets of CommunicationOptions(bucket_bytes=...)",
    "groups": "the gradients go in buckets of CommunicationOptions(bucket_bytes=...)",
    "process_set": "the job's ranks are its one process set",
    "scale_local_gradients": "every variable is reduced over the job's ranks",
}
HOROVOD_AVERAGE = 0  # hvd.Average (horovod.tensorflow.mpi_ops), without importing Horovod


def _no_compression(compression: Any) -> bool:
    """None, or hvd.Compression.none (matched by name: the runtime imports no Horovod here)."""
    return compression is None or getattr(compression, "__name__", "") == "NoneCompressor"


def check_horovod_options(communication: CommunicationOptions, compression: Any,
                          sparse_as_dense: bool, op: Any, others: Mapping[str, Any]) -> None:
    """Refuses, naming it and why, an hvd.DistributedGradientTape option this tape cannot honour
    (ValueError; TypeError for a name Horovod's tape does not have either). Accepted: the job's
    own compression (None: as the job is set; compression is set once per job, in
    CommunicationOptions), sparse_as_dense either way (gradients are always densified, which
    gives the same values), and op=hvd.Average."""
    for name in others:
        if name not in NOT_TAKEN:
            raise TypeError(f"gradient_tape() got an unexpected keyword argument {name!r}")
        raise ValueError(f"crossover_tf: strategy.gradient_tape does not take Horovod's {name}: "
                         f"{NOT_TAKEN[name]}")
    if op is not None and op != HOROVOD_AVERAGE:
        raise ValueError(f"crossover_tf: strategy.gradient_tape takes op=hvd.Average only (the "
                         f"mean over the job's ranks, as tf.distribute's); got op={op!r}")
    del sparse_as_dense  # either way: the values are the same
    if compression is None:
        return
    if resolve_backend(communication.backend)[0] != "horovod" and not _no_compression(
            compression):
        raise ValueError("crossover_tf: gradient compression is Horovod's; this job runs "
                         "TensorFlow's collectives, which send gradients as they are")
    job = communication.compression
    if _no_compression(compression) and _no_compression(job):
        return
    if compression is job:
        return
    if _no_compression(compression):
        raise ValueError(f"crossover_tf: this job compresses its gradients ({job!r}); a tape "
                         "cannot ask for none: set it once in CommunicationOptions(compression"
                         "=...)")
    raise ValueError(f"crossover_tf: strategy.gradient_tape(compression={compression!r}) differs "
                     f"from the job's ({job!r}): compression is set once per job, in "
                     "CommunicationOptions(compression=...), under backend='horovod'")


class CrossoverGradientTape:
    """Like hvd.DistributedGradientTape, gradient() averages the gradients over the job's
    ranks, with the device yielded for the allreduce (and the link turn taken around it, when
    the job has one). Other attributes are the wrapped tape's."""

    def __init__(self, tape: tf.GradientTape, protocol: StepProtocol):
        self._tape = tape
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tape, name)

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        refuse_inside_run("strategy.gradient_tape(tape).gradient()")
        hold = innermost_hold()
        if self._protocol.is_crossover and hold is None:
            raise RuntimeError(
                "crossover_tf: strategy.gradient_tape(...).gradient() runs outside "
                "strategy.hold_device(); put the step (forward, gradient, apply) inside "
                "`with strategy.hold_device():` so its compute holds the device and the "
                "allreduce does not")
        grads = self._tape.gradient(target, sources, output_gradients, unconnected_gradients)
        flat = [None if g is None else tf.convert_to_tensor(g) for g in tf.nest.flatten(grads)]
        flat = reduce_yielded(flat, lambda ts, overlap, yielded: (
            self._protocol.allreduce_gradients_in_turn(ts, overlap=overlap, after=yielded)))
        return tf.nest.pack_sequence_as(grads, flat)
