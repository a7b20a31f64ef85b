"""Crossing for custom training loops: a device hold and a gradient tape, as in Horovod.

A plain Horovod loop wraps its tape in `hvd.DistributedGradientTape`. A crossed loop puts
its step inside `strategy.hold_device()` and wraps its tape in `strategy.gradient_tape(tape)`:

    with strategy.hold_device():                   # acquire ... yield at the end
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = strategy.gradient_tape(tape)        # gradient(): yield, allreduce, acquire
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

which runs `acquire -> compute -> yield -> allreduce -> acquire -> apply -> yield`, the same
protocol as the Keras train step (train_step.py). This module is the hold; the tape is
_protocol/gradient_tape.py. In a tf.function the order is made explicit, not left to data
flow: every op written inside the hold starts after its acquire, the mid-step yield waits for
every op written before gradient() (a metric update the gradients do not need included),
everything after gradient() waits for the re-acquire, and the closing yield waits for every
op written inside. Eagerly, program order is the order.

The contract is checked where it can be. gradient() outside a hold is an error (a yield of a
device not held would let the loop compute unheld). In a tf.function, a collective
written inside the hold other than the tape's own allreduce (hvd.DistributedGradientTape,
strategy.reduce, a sync-BatchNorm layer; Horovod's, TensorFlow's or NCCL's ops) is an error
when the hold closes: the job would hold the device while waiting on the network.
Collectives inside nested tf.functions, tf.cond / tf.while_loop bodies and tf.switch_case
branches are found too. A tf.py_function or tf.numpy_function in the hold is refused as well:
its Python cannot be read. Run eagerly, nothing can be seen: keep collectives out of the hold.

XLA: the lease ops and Horovod's collectives have no XLA kernels, so the loop's own
tf.function stays jit_compile=False; compile its device parts with nested
tf.function(jit_compile=True) calls inside the hold (as the Keras step does).
"""
from __future__ import annotations

import threading
from typing import Any

import tensorflow as tf

from crossover_tf import lease as lease_lib
from crossover_tf._nest import map_present

# The ops that wait on other ranks, under either backend. Horovod's (mpi_ops.py; HorovodSize
# and the like only read local state), TensorFlow's collective ops (collective_ops.py, every
# version) and NCCL's (nccl_ops.py).
COLLECTIVE_OPS = frozenset({
    "HorovodAllreduce", "HorovodGroupedAllreduce", "HorovodAllgather",
    "HorovodGroupedAllgather", "HorovodBroadcast", "HorovodBroadcastInplace",
    "HorovodBroadcastInplaceResource", "HorovodAlltoall", "HorovodReducescatter",
    "HorovodGroupedReducescatter", "HorovodJoin",
    "CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3", "CollectiveGather",
    "CollectiveGatherV2", "CollectiveBcastSend", "CollectiveBcastRecv", "CollectiveBcastSendV2",
    "CollectiveBcastRecvV2", "CollectiveAllToAllV2", "CollectiveAllToAllV3",
    "CollectiveReduceScatterV2", "CollectiveInitializeCommunicator", "CollectivePermute",
    "NcclAllReduce", "NcclBroadcast", "NcclReduce"})
# Ops that run Python the check cannot read (tf.py_function, tf.numpy_function): refused in a
# hold, since their body could wait on the network (an eager hvd.allreduce, a gRPC call).
PYTHON_OPS = frozenset({"EagerPyFunc", "PyFunc", "PyFuncStateless"})

_local = threading.local()  # the holds open in this thread (a tf.function traces in one)


def _open_holds() -> list["DeviceHold"]:
    if not hasattr(_local, "holds"):
        _local.holds = []
    return _local.holds


def innermost_hold() -> "DeviceHold | None":
    """The hold open in this thread (None: the code runs outside strategy.hold_device())."""
    holds = _open_holds()
    return holds[-1] if holds else None


class DeviceHold:
    """`with strategy.hold_device():` holds this job's device lease for the code inside.

    Without a lease (no crossover group) it does nothing, so one loop serves both. Not
    reentrant: one hold per step.
    """

    def __init__(self, lease: lease_lib.DeviceLease | None, reserve_s: float = 0.0):
        self.lease = lease
        self.reserve_s = reserve_s
        self._graph: Any = None
        self._first = 0                  # index of the hold's first op in the graph
        self._controls: list[Any] = []   # control-dependency contexts this hold entered
        self._exempt: set[str] = set()   # the ops of the tape's own allreduces
        self._mark = 0                   # first op after the latest mid-step yield

    def __enter__(self) -> "DeviceHold":
        if any(hold.lease is not None for hold in _open_holds()):
            raise RuntimeError("crossover_tf: strategy.hold_device() is already open in this "
                               "step; a step holds the device once")
        _open_holds().append(self)
        if self.lease is None:
            return self
        token = self.lease.acquire(tf.constant(0), tag=lease_lib.TAG_COMPUTE)
        if not tf.executing_eagerly():
            self._graph = tf.compat.v1.get_default_graph()
            self._first = len(self._graph.get_operations())
            self._enter_control(token)
            creator = tf.variable_creator_scope(_created_outside_the_hold)
            creator.__enter__()
            self._controls.append(creator)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        _open_holds().remove(self)
        if self.lease is None:
            return
        if self._graph is None:  # eager: the ops ran in program order; give the device back
            self.lease.yield_device(tf.constant(0), reserve_s=self.reserve_s)
            return
        while self._controls:
            self._controls.pop().__exit__(None, None, None)
        if exc_type is not None:
            return  # the trace fails anyway
        written = self._written()
        self._refuse_collectives(written)
        with tf.control_dependencies(written):
            self.lease.yield_device(tf.constant(0), reserve_s=self.reserve_s)

    @property
    def traced(self) -> bool:
        """Whether the hold is being traced into a graph (else it runs eagerly)."""
        return self._graph is not None

    def yield_for(self, tensors: list[Any]) -> list[Any]:
        """Passes gradients through a yield that waits for everything written so far."""
        if self.lease is None:
            return tensors
        if self._graph is None:
            return map_present(self.lease.yield_device, tensors)
        with tf.control_dependencies(self._written()):
            tensors = map_present(self.lease.yield_device, tensors)
        self._mark = len(self._graph.get_operations())
        return tensors

    def yield_when_written(self) -> Any:
        """In a trace: a yield that waits for everything written so far and passes nothing
        through, so the collectives written after it may start before it (reduce_yielded's
        overlap); returns the yield's output, for the re-acquire to wait on."""
        return self.yield_for([tf.constant(0)])[0]

    def acquire_after(self, tensors: list[Any], yielded: Any = None) -> list[Any]:
        """Passes the reduced gradients through the re-acquire (which also waits for yielded,
        the mid-step yield, when the gradients did not go through it); what follows waits for
        it."""
        if self.lease is None:
            return tensors
        if self._graph is not None:  # the ops since the yield are the tape's own allreduce
            self._exempt.update(op.name for op in self._graph.get_operations()[self._mark:])
        with tf.control_dependencies([] if yielded is None else [yielded]):
            tensors = map_present(lambda ts: self.lease.acquire(ts, tag=lease_lib.TAG_APPLY),
                                  tensors)
        if self._graph is None:
            return tensors
        present = [t for t in tensors if t is not None]
        if present:
            self._enter_control(present[0])
        return tensors

    def _enter_control(self, tensor: Any) -> None:
        """Every op written from here until the hold closes waits for `tensor`'s op."""
        control = self._graph.control_dependencies([tensor])
        control.__enter__()
        self._controls.append(control)

    def _written(self) -> list[Any]:
        return self._graph.get_operations()[self._first:]

    def _refuse_collectives(self, written: list[Any]) -> None:
        library = {f.signature.name: f
                   for f in self._graph.as_graph_def().library.function}
        inside = [(found, op.name) for op in written if op.name not in self._exempt
                  for found in _collectives(op.type, op.node_def.attr, library, set())]
        python = [f"{kind} {name!r}" for kind, name in inside if kind in PYTHON_OPS]
        if python:
            raise ValueError(
                f"crossover_tf: Python op(s) {', '.join(python)} (tf.py_function, "
                "tf.numpy_function) inside strategy.hold_device(): their Python cannot be "
                "checked for collectives, which would hold the device while waiting on the "
                "network. Run them outside the hold, or in the input pipeline.")
        if inside:
            raise ValueError(
                f"crossover_tf: collective(s) "
                f"{', '.join(f'{kind} {name!r}' for kind, name in inside)} inside "
                "strategy.hold_device(): the job would hold the device while it waits on the "
                "network, and the peer job could not compute. Use "
                "strategy.gradient_tape(tape) instead of hvd.DistributedGradientTape, and run "
                "other collectives (strategy.reduce, metrics) outside the hold.")


def reduce_yielded(tensors: list[Any], reduce: Any) -> list[Any]:
    """reduce(tensors) with this thread's hold (if any) yielded around it: yield -> reduce ->
    re-acquire, so the device is never held while the step waits on the network. The tape's
    allreduce and the reductions inside strategy.run both go through it.

    reduce(tensors, overlap, yielded) says whether its collectives may start before the yield,
    and passes the yield's output (None: no yield) for what must wait for it (the link turn's
    wait, a blocking kernel). In a traced hold they may (overlap=True): the yield waits for
    every op written so far (the forward and backward passes, the metrics) but not for the
    collectives, which are written after it and consume the gradients as they come, so a
    bucket's allreduce runs on the network while the backward pass computes the next; the
    re-acquire waits for the yield and the reduced values. Eagerly, program order is the order
    (overlap=False).
    """
    hold = innermost_hold()
    eager = tf.executing_eagerly()
    if hold is None or hold.lease is None:  # nothing to yield
        return reduce(tensors, False, None) if eager else _reduce_in_parallel(
            tensors, reduce, None)
    if eager or not hold.traced:  # (a hold opened eagerly around a traced reduction too)
        return hold.acquire_after(reduce(hold.yield_for(tensors), False, None))
    yielded = hold.yield_when_written()
    return hold.acquire_after(_reduce_in_parallel(tensors, reduce, yielded), yielded)


def _reduce_in_parallel(tensors: list[Any], reduce: Any, yielded: Any) -> list[Any]:
    """reduce(tensors, True, yielded) traced so that its stateful ops (the link turn's wait, a
    TensorFlow collective) run when their inputs exist. tf.function otherwise chains every
    stateful op that takes no resource in program order (auto_control_deps), which would make
    each bucket's collective wait for the mid-step yield written before it, and each bucket
    for the one before: no overlap. Their order is the data flow: gradients -> turn wait ->
    buckets -> turn done -> re-acquire (which also waits for the yield)."""
    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    reduced = reduce(tensors, True, yielded)
    manager = getattr(graph, "experimental_acd_manager", None)
    if manager is not None:
        for op in graph.get_operations()[first:]:
            if op._is_stateful:
                manager.run_independently(op)
    return reduced


def _created_outside_the_hold(next_creator: Any, **kwargs: Any) -> Any:
    """A variable made inside a traced hold (an optimizer's slots, built on its first apply)
    is made without the hold's control dependencies. TensorFlow lifts a variable's initial
    value out of the function into one that runs first, and with those dependencies it took
    the hold's acquire, compute, yield, allreduce and re-acquire along: the re-acquired device
    then stayed with the job past the step, and a crossed peer timed out waiting for it."""
    with tf.control_dependencies(None):
        return next_creator(**kwargs)


def _collectives(op_type: str, attrs: Any, library: dict[str, Any], seen: set[str]
                 ) -> list[str]:
    """The collective (or Python) op types an op runs: itself, or inside the functions it
    calls: a nested tf.function, as Horovod's tape writes its allreduce; a tf.cond or
    tf.while_loop body (one function each); tf.switch_case's branches (a list of functions)."""
    found = [op_type] if op_type in COLLECTIVE_OPS | PYTHON_OPS else []
    for value in attrs.values():
        for name in [value.func.name, *(f.name for f in value.list.func)]:
            if not name or name in seen or name not in library:
                continue
            seen.add(name)
            for node in library[name].node_def:
                found += _collectives(node.op, node.attr, library, seen)
    return found
