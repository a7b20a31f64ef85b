"""CrossoverStrategy: tf.distribute-style surface over the job's ranks plus the device lease.

It is a wrapper with tf.distribute.Strategy's method names rather than a subclass: Keras 3
reads `distribute_strategy` from the current tf.distribute strategy and, for a custom subclass,
routes variable creation and the train loop through tf.distribute's replica machinery, which
Horovod's one-process-per-replica model does not fit. Like OneDeviceStrategy, each process is
one replica on one device; Horovod (or TensorFlow's collectives) connects the processes.
Learning rates are used as given: nothing is scaled by the number of replicas (scale it
yourself if you want the usual linear rule).
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator, Sequence, TypeVar

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from crossover_tf import callbacks, options
from crossover_tf._keras import install as keras_install
from crossover_tf._protocol import ownership
from crossover_tf._keras.fit_guard import guard_fit
from crossover_tf import lease as lease_lib
from crossover_tf._communication import communicator_for
from crossover_tf._protocol import datasets, replica_context
from crossover_tf._protocol.gradient_tape import CrossoverGradientTape, check_horovod_options
from crossover_tf._protocol.optimizer_guard import guard_optimizers, refuse_inside_run
from crossover_tf._protocol.step_protocol import StepProtocol
from crossover_tf._setup.bring_up import bring_up
from crossover_tf.options import (CommunicationOptions, DeviceOptions, LeaseOptions,
                                  LinkTurnOptions)

_Options = TypeVar("_Options")


class CrossoverStrategy:
    """Synchronous data parallelism (Horovod, or TensorFlow's collectives), crossed with peer
    jobs on the same devices.

    Args:
      group: crossover group key shared by the jobs that take turns on each device. Empty:
        plain data parallelism, no lease (the baseline). None (the default): $CROSSOVER_GROUP,
        and plain data parallelism where it is unset (options.resolve_group).
      lease: how the group's jobs share a device: how many jobs the group has (each job waits
        at start until they are all there, and fails loudly otherwise), priority, lease
        directory (options.LeaseOptions).
      link_turn: this job's place in the group's allreduce order (options.LinkTurnOptions);
        None: the jobs' allreduces overlap as they come.
      device: device pinning, key and memory (options.DeviceOptions).
      communication: the backend (Horovod or TensorFlow's collectives), its set-up,
        compression and allreduce placement
        (options.CommunicationOptions).

    The rank's crossing protocol (the lease, the link turn, the device, and every verb a step
    runs) is one object behind the read-only `extended`, as tf.distribute keeps a strategy's
    machinery there (_protocol.step_protocol.StepProtocol); what users and tools need of it
    is public here (device_key, priority, the stats and timelines, pause/resume_link_turn).
    Every collective goes through one communicator (_communication.communicator).

    Contract for the model: its forward and backward pass (layers, losses, metrics) must run no
    collective, such as a Horovod allreduce inside a synchronized BatchNorm. They run while this
    rank holds the device lease, so such a collective would hold the device while it waits for
    the job's other ranks: the peer job waits meanwhile, and crossed over several hosts the
    waits can form a cycle that only the lease timeout breaks. With jit_compile=True, XLA
    refuses such ops (they have no XLA kernels); with jit off nothing detects them.
    """

    def __init__(self, group: str | None = None, *, lease: LeaseOptions | None = None,
                 link_turn: LinkTurnOptions | None = None, device: DeviceOptions | None = None,
                 communication: CommunicationOptions | None = None):
        group = options.resolve_group(group)
        if group:
            lease_lib.segments.validate_name("group", group, lease_lib.segments.GROUP_MAX_LEN)
        lease = _checked("lease", lease, LeaseOptions)
        device = _checked("device", device, DeviceOptions)
        communication = _checked("communication", communication, CommunicationOptions)
        if link_turn is not None:
            _checked("link_turn", link_turn, LinkTurnOptions)
        options.check_combination(group, lease, link_turn)
        self._protocol = bring_up(group, lease, link_turn, device, communication,
                                  communicator_for(communication))
        ownership.register(self._protocol)
        guard_fit()  # fit on a model made in scope() crosses; a fit that fails still leaves
        guard_optimizers()  # no update of this job's variables with unreduced gradients
        logging.info("crossover_tf: rank %d/%d %s", self.rank, self.size, self._protocol)

    # ----- tf.distribute-style surface -------------------------------------------------------
    @property
    def extended(self) -> StepProtocol:
        """The strategy's machinery, the rank's step protocol (read-only, as tf.distribute's)."""
        return self._protocol

    @property
    def num_replicas_in_sync(self) -> int:
        return self._protocol.comm.size

    @property
    def rank(self) -> int:
        return self._protocol.comm.rank

    @property
    def size(self) -> int:
        return self._protocol.comm.size

    @property
    def local_rank(self) -> int:
        return self._protocol.comm.local_rank

    @property
    def should_save_summary(self) -> bool:
        """Only rank 0 writes summaries (TensorBoard) so runs are not duplicated per rank."""
        return self._protocol.should_save_summary

    @property
    def should_checkpoint(self) -> bool:
        """Only rank 0 saves models/checkpoints; all ranks hold identical weights."""
        return self._protocol.should_checkpoint

    @property
    def group(self) -> str:
        return self._protocol.group

    @property
    def is_crossover(self) -> bool:
        """True with a crossover group: steps take the device lease."""
        return self._protocol.is_crossover

    @property
    def device_key(self) -> str:
        """This rank's device on its host: the key its lease is shared under."""
        return self._protocol.device_key

    @property
    def priority(self) -> str:
        """This job's lease priority class ("normal", "primary" or "secondary")."""
        return self._protocol.lease_options.priority

    @property
    def taking_link_turns(self) -> bool:
        """True when this job's allreduces take link turns with the group's other jobs."""
        return self._protocol.link_turn is not None

    @property
    def in_link_turn_order(self) -> bool:
        """True while this job is in the group's link-turn order: from its join (its first
        step) until a pause, leave_device() or the end of fit; the other jobs wait for its
        turns only then."""
        return self._protocol.link_turn is not None and self._protocol.link_turn.joined

    @contextlib.contextmanager
    def scope(self) -> Iterator["CrossoverStrategy"]:
        """Places variables and ops created inside on this replica's device, and makes the
        models made inside this job's: their fit, evaluate and predict cross and synchronise
        with no callback, as under MultiWorkerMirroredStrategy (_protocol.ownership)."""
        with tf.device(self._protocol.device), ownership.owned_by(self._protocol):
            yield self

    def run(self, fn: Callable[..., Any], args: Sequence[Any] = (),
            kwargs: dict[str, Any] | None = None) -> Any:
        """Runs fn once on this process's replica (one replica per process, as with Horovod),
        as MultiWorkerMirroredStrategy's run does for a worker: inside, tf.distribute's replica
        context answers for the job (num_replicas_in_sync, replica_id_in_sync_group,
        all_reduce), so tf.nn.compute_average_loss scales by the global batch and the Keras
        optimizer sums the gradients over the ranks (_protocol.replica_context); fn holds
        the device (strategy.hold_device()), yielded for every reduction. Before the first
        update, the variables made in scope() start from rank 0's values."""
        with self.scope():
            fresh = ownership.not_yet_broadcast(self._protocol)
            if fresh and self.size > 1:
                with tf.init_scope():  # traced in a tf.function: broadcast now, eagerly
                    self._protocol.broadcast_variables(fresh, 0)
            with replica_context.entered(self._protocol), self._protocol.device_hold():
                return fn(*args, **(kwargs or {}))

    def reduce(self, reduce_op: Any, value: Any, axis: int | None = None) -> Any:
        """Reduces value across all ranks (and first along axis locally, as tf.distribute does).

        A collective: call it outside any region that holds the device lease.
        """
        return self._protocol.comm.reduce(reduce_op, value, axis)

    def distribute_dataset(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """Splits each *global* batch so this rank gets rows rank, rank+size, ...

        Every rank must see the same global batches (same order and seed). Step s on all ranks
        together then covers exactly global batch s, which is what makes the distributed job
        equal to a single process on the global batch. Each rank reads all data; for large
        inputs prefer distribute_datasets_from_function, which reads only this rank's shard.
        """
        return datasets.split_global_batches(dataset, self.rank, self.size, contiguous=False)

    def experimental_distribute_dataset(self, dataset: tf.data.Dataset,
                                        options: Any = None) -> tf.data.Dataset:
        """This rank's part of each *global* batch, as MultiWorkerMirroredStrategy gives a
        worker with its DATA auto-sharding: every rank reads the same batches and keeps its
        contiguous slice, rows [rank * B/N, (rank + 1) * B/N) of a global batch of B rows (B
        must be divisible by the N ranks). distribute_dataset takes rows rank, rank+N, ...
        instead; both cover each global batch once."""
        del options  # tf.distribute.InputOptions: prefetching to devices has no meaning here
        return datasets.split_global_batches(dataset, self.rank, self.size, contiguous=True)

    def experimental_local_results(self, value: Any) -> tuple[Any, ...]:
        """The values of this process's replicas: (value,), one replica per process."""
        return (value,)

    def gather(self, value: Any, axis: int) -> Any:
        """Every rank's value concatenated along axis, in rank order, on every rank (as
        MultiWorkerMirroredStrategy's gather of per-replica values). Eager only: it moves the
        values through the host (a collective; outside any hold of the device)."""
        if not tf.executing_eagerly():
            raise RuntimeError("crossover_tf: strategy.gather runs eagerly, outside "
                               "tf.function; reduce inside with strategy.reduce instead")
        parts = self._protocol.comm.gather(np.asarray(value))
        return tf.constant(np.concatenate(parts, axis=axis))

    @property
    def cluster_resolver(self) -> Any:
        """This rank's place in the job, as tf.distribute's cluster_resolver: the task type
        and id (task_id == rank) that checkpointing code asks for. From TF_CONFIG when it is
        set (the TensorFlow backend's ranks), else one "worker" task per rank."""
        from tensorflow.python.distribute.cluster_resolver import (SimpleClusterResolver,
                                                                   TFConfigClusterResolver)
        if os.environ.get("TF_CONFIG"):
            return TFConfigClusterResolver()
        return SimpleClusterResolver(tf.train.ClusterSpec({}), task_type="worker",
                                     task_id=self.rank)

    def distribute_datasets_from_function(
            self, dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset]
    ) -> tf.data.Dataset:
        """Calls dataset_fn with this rank's InputContext (shard index = rank)."""
        context = tf.distribute.InputContext(num_input_pipelines=self.size,
                                             input_pipeline_id=self.rank,
                                             num_replicas_in_sync=self.size)
        return datasets.mark_per_rank(dataset_fn(context))

    # ----- Keras integration -----------------------------------------------------------------
    def callbacks(self, *, micro_batches: int = 1, average_metrics: bool = True
                  ) -> list[keras.callbacks.Callback]:
        """Callbacks for model.fit: run crossover steps (rank 0's state broadcast before the
        first), average logged metrics over ranks, leave the device when training ends.

        micro_batches > 1 computes each step as that many equal micro-batches, each under its
        own hold, accumulating gradients (the full batch's result, except for batch-dependent
        layers such as BatchNorm): a secondary's micro-batch bounds how long a primary waits.
        """
        options.validate_micro_batches(micro_batches)
        return callbacks.for_fit(self._protocol, micro_batches, average_metrics)

    def prepare(self, model: keras.Model, *, micro_batches: int = 1) -> None:
        """Makes a compiled model's fit, evaluate and predict run crossover steps.

        fit with callbacks() does this; call it yourself before an evaluate that every rank
        runs on a model that has not been fit in this process (one just loaded, say), so that
        it returns the job's metrics (averaged over the ranks, as fit's epoch logs are) on
        every rank. Without it, such a model's evaluate and predict run on the calling rank
        alone (under the lease in a crossover group), as under MultiWorkerMirroredStrategy.
        """
        options.validate_micro_batches(micro_batches)
        keras_install.install(model, self._protocol, micro_batches)

    def micro_batches_of(self, model: keras.Model) -> int:
        """The micro-batches model's crossover train step computes in (1 without hooks)."""
        return keras_install.micro_batches_of(model)

    def broadcast_variables(self, variables: Sequence[Any], root_rank: int = 0) -> None:
        """Overwrites variables on every rank with root_rank's values (e.g. after restoring a
        checkpoint on rank 0 only). A collective; ranks must pass matching variable lists,
        otherwise every rank raises a ValueError naming the first mismatch. Eager only: inside
        a tf.function (where Horovod's idiom calls hvd.broadcast_variables, in the first step)
        it is refused at trace, naming where to call it instead."""
        if tf.inside_function():
            raise RuntimeError(
                "crossover_tf: strategy.broadcast_variables inside a tf.function: it is a "
                "collective of the job's ranks whose check runs eagerly, and inside a step it "
                "would wait on the network while the step holds the device. Call it eagerly, "
                "once, after the first step instead of inside it (Horovod's `if first_batch:` "
                "branch): `loss = train_step(x, y)` then `if step == 0: "
                "strategy.broadcast_variables(model.variables + optimizer.variables)`, or "
                "before the loop after optimizer.build() (docs/coming_from_horovod.md)")
        self._protocol.broadcast_variables(variables, root_rank)

    # ----- custom training loops -------------------------------------------------------------
    def hold_device(self) -> contextlib.AbstractContextManager[Any]:
        """`with strategy.hold_device():` around a custom loop's step (forward, gradient(),
        apply) holds the device for its compute; strategy.gradient_tape's gradient() yields it
        for the allreduce. Without a group it does nothing (custom_loop explains the order).
        Inside strategy.run, which holds the device already, it is a deprecated no-op whose
        block runs as outside run (replica_context.nested_hold)."""
        if replica_context.current() is not None:
            return replica_context.nested_hold()
        return self._protocol.device_hold()

    def gradient_tape(self, tape: tf.GradientTape, *, compression: Any = None,
                      sparse_as_dense: bool = False, op: Any = None,
                      **horovod_options: Any) -> CrossoverGradientTape:
        """Wraps a tf.GradientTape as hvd.DistributedGradientTape does: gradient() averages
        over the job's ranks, with the device yielded (and the link turn taken, joined on
        first use) for the allreduce. Call its gradient() inside strategy.hold_device().

        Horovod's options a port keeps: compression (the job's own, set once in
        CommunicationOptions(compression=...); None: as the job is set), sparse_as_dense
        (gradients are densified either way) and op=hvd.Average; any other is refused by name
        (check_horovod_options)."""
        check_horovod_options(self._protocol.communication, compression, sparse_as_dense, op,
                              horovod_options)
        return CrossoverGradientTape(tape, self._protocol)

    # ----- crossover -------------------------------------------------------------------------
    def synchronize_gradients(self, grads: Sequence[Any]) -> list[Any]:
        """Averages gradients over all ranks (one grouped allreduce; None stays None).

        A collective: call it with the device yielded (it takes no link turn). Not inside
        strategy.run, where the optimizer sums the gradients itself.
        """
        refuse_inside_run("strategy.synchronize_gradients")
        return self._protocol.allreduce_gradients(grads)

    def pause_link_turn(self) -> None:
        """Steps out of the link turn before a pause between steps (a checkpoint, a barrier,
        your own evaluation), so the peer job's allreduces do not wait for ours; no-op without
        link turns. resume_link_turn joins again (a collective of the job's ranks)."""
        self._protocol.pause_link_turn()

    def resume_link_turn(self) -> None:
        """Joins the link turn again after pause_link_turn (a collective of the job's ranks)."""
        self._protocol.resume_link_turn()

    def leave_device(self) -> None:
        """Eagerly gives up the lease if held and the link turn if taken (end of training,
        errors): the peer job never waits on us; no-op otherwise."""
        self._protocol.leave()

    def link_turn_stats(self) -> dict[str, float]:
        """This process's link turn statistics ({} without a link turn)."""
        return self._protocol.link_turn_stats()

    def lease_stats(self) -> dict[str, float]:
        """This process's lease statistics ({} without a crossover group)."""
        return self._protocol.lease_stats()

    def lease_timeline(self) -> np.ndarray | None:
        """This process's recorded holds of the device (None without a crossover group)."""
        return self._protocol.lease_timeline()

    def link_turn_timeline(self) -> np.ndarray | None:
        """This process's recorded link turns (None without link turns)."""
        return self._protocol.link_turn_timeline()


def _checked(name: str, value: _Options | None, kind: type[_Options]) -> _Options:
    """The option group given, or its defaults; anything else is a TypeError that says what
    the argument takes (strategies before option groups took flat keyword arguments)."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise TypeError(f"crossover_tf: CrossoverStrategy's {name} takes a "
                        f"crossover_tf.{kind.__name__}, got {type(value).__name__}")
    return value
