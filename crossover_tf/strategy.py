"""CrossoverStrategy: tf.distribute-style surface over Horovod plus the device lease.

It is a wrapper with tf.distribute.Strategy's method names rather than a subclass: Keras 3
reads `distribute_strategy` from the current tf.distribute strategy and, for a custom subclass,
routes variable creation and the train loop through tf.distribute's replica machinery, which
Horovod's one-process-per-replica model does not fit. Like OneDeviceStrategy, each process is
one replica on one device; Horovod connects the processes. Learning rates are used as given:
nothing is scaled by the number of replicas (scale it yourself if you want the usual linear rule).
"""
from __future__ import annotations

import contextlib
import socket
from typing import Any, Callable, Iterator, Sequence

import horovod.tensorflow as hvd
import keras
import tensorflow as tf
from absl import logging

from crossover_tf import callbacks, collectives, custom_loop, devices, keras_hooks
from crossover_tf import lease as lease_lib


class CrossoverStrategy:
    """Synchronous data parallelism with Horovod, crossed with a peer job on the same devices.

    Args:
      group: crossover group key shared by the two jobs that take turns on each device.
        Empty or None: plain Horovod, no lease (the baseline).
      device_key: name of this process's device on its host; default $CROSSOVER_DEVICE_KEY or
        gpu<local_rank>/cpu<local_rank>.
      lease_timeout_s: how long an acquire may wait before failing (a stuck or dead peer).
      compression: Horovod gradient compression (hvd.Compression.none or .fp16).
      init_horovod: call hvd.init(); with False, Horovod must already be initialised.
      configure_devices: pin each rank to its local GPU and apply the memory policy below.
        This must happen before TensorFlow initialises its devices, so construct the strategy
        before creating any tensor or model; False leaves GPU setup to you.
      memory_growth: let TensorFlow allocate GPU memory as needed instead of taking nearly all
        of it at start-up, which would leave the peer job nothing (the default).
      memory_limit_mb: instead of growth, cap this job's GPU memory (predictable sharing).
      allreduce_on: "auto" (host memory via Gloo for a crossover group on GPU, else next to
        the gradients), "host" or "device"; see devices.allreduce_device for why.
      priority: "normal" (jobs of a group take turns, FIFO), "primary" (never queues behind a
        secondary, and keeps secondaries out for primary_reserve_s after each step so they do
        not start work it would wait for) or "secondary" (fills the primary's gaps).
      micro_batches: split each step's compute into this many equal micro-batches, each under
        its own hold, accumulating gradients (same result as the full batch, except for
        batch-dependent layers such as BatchNorm). A secondary's micro-batch bounds how long a
        primary can wait for it.
      primary_reserve_s: how long a primary's step-end yield keeps secondaries out.
      link_turn: this job's position (0, 1, ...) in its group's allreduce order, the same on
        every host and distinct per job; None: the jobs' allreduces overlap as they come.
        With it the group's jobs run their gradient allreduces one at a time on each host
        (lease.link_turn explains why and why it cannot deadlock).
      link_turn_jobs: how many jobs the group has (every job must say the same).
      link_turn_wait_s: the longest one allreduce waits for another job's earlier one (a
        peer paused outside a step, e.g. saving a checkpoint); then it runs anyway.
        link_turn needs priority="normal" (lease.link_turn says why).

    Contract for the model: its forward and backward pass (layers, losses, metrics) must run no
    collective, such as a Horovod allreduce inside a synchronized BatchNorm. They run while this
    rank holds the device lease, so such a collective would hold the device while it waits for
    the job's other ranks: the peer job waits meanwhile, and crossed over several hosts the
    waits can form a cycle that only lease_timeout_s breaks. With jit_compile=True, XLA refuses
    such ops (they have no XLA kernels); with jit off nothing detects them.
    """

    def __init__(self, group: str | None = "", *, device_key: str | None = None,
                 lease_timeout_s: float = 600.0, compression: Any = hvd.Compression.none,
                 init_horovod: bool = True, configure_devices: bool = True,
                 memory_growth: bool = True, memory_limit_mb: int | None = None,
                 allreduce_on: str = "auto", priority: str = "normal",
                 micro_batches: int = 1, primary_reserve_s: float = 0.05,
                 link_turn: int | None = None, link_turn_jobs: int = 2,
                 link_turn_wait_s: float = 10.0):
        if init_horovod:
            hvd.init()
        elif not hvd.is_initialized():
            raise RuntimeError("crossover_tf: Horovod is not initialised; call hvd.init() first "
                               "or construct CrossoverStrategy(init_horovod=True)")
        self.group = group or ""
        # Checked here too: without a group no lease is made, but bad input is still an error.
        lease_lib.validate_priority(priority)
        lease_lib.validate_reserve(primary_reserve_s)
        if link_turn is not None:
            lease_lib.validate_turn(link_turn, link_turn_jobs)
            lease_lib.validate_timeout(link_turn_wait_s)
            lease_lib.validate_turn_priority(priority)
            if not self.group:
                raise ValueError("crossover_tf: link_turn orders the allreduces of a crossover "
                                 "group's jobs; it needs a group")
        self.compression = compression
        self.memory = devices.GpuMemoryPolicy(growth=memory_growth and memory_limit_mb is None,
                                              limit_mb=memory_limit_mb)
        gpu_ordinal = self._configure_devices(configure_devices)
        self.device_key = device_key or devices.device_key(
            hvd.local_rank(), gpu_ordinal, devices.CudaDriver() if gpu_ordinal is not None
            else None)
        self.lease = (lease_lib.DeviceLease(self.group, self.device_key, lease_timeout_s,
                                            priority) if self.group else None)
        self.turn = (lease_lib.LinkTurn(self.lease, link_turn, link_turn_jobs,
                                        self._agree_on_min, link_turn_wait_s, self._barrier)
                     if self.lease is not None and link_turn is not None else None)
        if self.lease is not None:
            keras_hooks.guard_fit()  # a fit that fails between steps must still leave
        self.priority = priority
        self.micro_batches = micro_batches
        self.step_end_reserve_s = primary_reserve_s if priority == "primary" else 0.0
        self._check_consistent_across_ranks()
        self._device = devices.local_device_name(tf.config.list_logical_devices("GPU"),
                                                 tf.config.list_logical_devices("CPU"),
                                                 self.local_rank)
        self.allreduce_device = devices.allreduce_device(allreduce_on, self.is_crossover,
                                                         self._device)
        logging.info("crossover_tf: rank %d/%d device %s lease %s turn %s", self.rank,
                     self.size, self._device, self.lease, self.turn)

    # ----- tf.distribute-style surface -------------------------------------------------------
    @property
    def num_replicas_in_sync(self) -> int:
        return hvd.size()

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
    def should_save_summary(self) -> bool:
        """Only rank 0 writes summaries (TensorBoard) so runs are not duplicated per rank."""
        return self.rank == 0

    @property
    def should_checkpoint(self) -> bool:
        """Only rank 0 saves models/checkpoints; all ranks hold identical weights."""
        return self.rank == 0

    @property
    def is_crossover(self) -> bool:
        return self.lease is not None

    @contextlib.contextmanager
    def scope(self) -> Iterator["CrossoverStrategy"]:
        """Places variables and ops created inside on this replica's device."""
        with tf.device(self._device):
            yield self

    def run(self, fn: Callable[..., Any], args: Sequence[Any] = (),
            kwargs: dict[str, Any] | None = None) -> Any:
        """Runs fn once on this process's replica (one replica per process, as with Horovod)."""
        with self.scope():
            return fn(*args, **(kwargs or {}))

    def reduce(self, reduce_op: Any, value: Any, axis: int | None = None) -> Any:
        """Reduces value across all ranks (and first along axis locally, as tf.distribute does).

        A collective: call it outside any region that holds the device lease.
        """
        op = collectives.horovod_reduce_op(reduce_op)

        def reduce_one(t: Any) -> tf.Tensor:
            t = tf.convert_to_tensor(t)
            if axis is not None:
                if op is hvd.Sum:
                    t = tf.reduce_sum(t, axis=axis)
                else:
                    # Mean over all ranks' elements: sum locally, divide by the global count.
                    count = hvd.allreduce(tf.cast(tf.shape(t)[axis], t.dtype), op=hvd.Sum)
                    return hvd.allreduce(tf.reduce_sum(t, axis=axis), op=hvd.Sum) / count
            return hvd.allreduce(t, op=op)

        return tf.nest.map_structure(reduce_one, value)

    def distribute_dataset(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """Splits each *global* batch so this rank gets rows rank, rank+size, ...

        Every rank must see the same global batches (same order and seed). Step s on all ranks
        together then covers exactly global batch s, which is what makes the distributed job
        equal to a single process on the global batch. Each rank reads all data; for large
        inputs prefer distribute_datasets_from_function, which reads only this rank's shard.
        """
        size, rank = self.size, self.rank
        if size == 1:
            return dataset

        def take_rows(*batch: Any) -> Any:
            first = tf.nest.flatten(batch)[0]
            tf.debugging.assert_equal(
                tf.shape(first)[0] % size, 0,
                message=f"global batch size must be divisible by the {size} Horovod ranks")
            picked = tf.nest.map_structure(lambda t: t[rank::size], batch)
            return picked if len(picked) > 1 else picked[0]

        return dataset.map(take_rows, num_parallel_calls=tf.data.AUTOTUNE,
                           deterministic=True).prefetch(tf.data.AUTOTUNE)

    def distribute_datasets_from_function(
            self, dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset]
    ) -> tf.data.Dataset:
        """Calls dataset_fn with this rank's InputContext (shard index = rank)."""
        context = tf.distribute.InputContext(num_input_pipelines=self.size,
                                             input_pipeline_id=self.rank,
                                             num_replicas_in_sync=self.size)
        return dataset_fn(context)

    # ----- Keras integration -----------------------------------------------------------------
    def callbacks(self, *, average_metrics: bool = True) -> list[keras.callbacks.Callback]:
        """Callbacks for model.fit: run crossover steps (rank 0's state broadcast before the
        first), average logged metrics over ranks, release the device when training ends."""
        result: list[keras.callbacks.Callback] = [callbacks.CrossoverTrainStepCallback(self)]
        if average_metrics:
            result.append(callbacks.MetricAverage(self))
        return result

    def prepare(self, model: keras.Model) -> None:
        """Makes a compiled model's fit, evaluate and predict run crossover steps.

        fit with callbacks() does this; call it yourself before evaluate or predict on a model
        that has not been fit in this process (one just loaded, say), so those steps take the
        device lease too, and evaluate returns the job's metrics (averaged over the ranks, as
        fit's epoch logs are) on every rank.
        """
        sync_state = self.broadcast_variables if self.size > 1 else None
        keras_hooks.install(model, keras_hooks.CrossoverSetup(
            self.lease, self.synchronize_gradients, sync_state, self.micro_batches,
            self.step_end_reserve_s, self.turn,
            collectives.average_scalars if self.size > 1 else None))

    def broadcast_variables(self, variables: Sequence[Any], root_rank: int = 0) -> None:
        """Overwrites variables on every rank with root_rank's values (e.g. after restoring a
        checkpoint on rank 0 only). A collective; ranks must pass matching variable lists,
        otherwise every rank raises a ValueError naming the first mismatch."""
        collectives.broadcast_variables(variables, root_rank)

    # ----- custom training loops -------------------------------------------------------------
    def hold_device(self) -> custom_loop.DeviceHold:
        """`with strategy.hold_device():` around a custom loop's step (forward, gradient(),
        apply) holds the device for its compute; strategy.gradient_tape's gradient() yields it
        for the allreduce. Without a group it does nothing (custom_loop explains the order)."""
        return custom_loop.DeviceHold(self.lease, self.step_end_reserve_s)

    def gradient_tape(self, tape: tf.GradientTape) -> custom_loop.CrossoverGradientTape:
        """Wraps a tf.GradientTape as hvd.DistributedGradientTape does: gradient() averages
        over the job's ranks, with the device yielded (and the link turn taken) for the
        allreduce. Call its gradient() inside strategy.hold_device()."""
        return custom_loop.CrossoverGradientTape(tape, self.synchronize_gradients,
                                                 needs_hold=self.lease is not None,
                                                 turn=self.turn)

    # ----- crossover -------------------------------------------------------------------------
    def synchronize_gradients(self, grads: Sequence[Any]) -> list[Any]:
        """Averages gradients over all ranks (one grouped allreduce; None stays None).

        A collective: the train step calls it with the device lease released.
        """
        return collectives.allreduce_gradients(grads, self.compression, self.allreduce_device)

    def release_device(self) -> None:
        """Eagerly gives up the lease if held and the link turn if taken (end of training,
        errors): the peer job never waits on us; no-op otherwise."""
        keras_hooks.release(self.lease, self.turn)

    def turn_stats(self) -> dict[str, float]:
        """This process's link turn statistics ({} without a link turn)."""
        return self.turn.stats().as_dict() if self.turn is not None else {}

    def lease_stats(self) -> dict[str, float]:
        """This process's lease statistics ({} without a crossover group)."""
        return self.lease.stats().as_dict() if self.lease is not None else {}

    # ----- internals -------------------------------------------------------------------------
    def _agree_on_min(self, value: int) -> int:
        """The smallest of every rank's value (a collective: the job's ranks agree on it)."""
        return min(collectives.allgather_objects(value)) if self.size > 1 else value

    def _barrier(self) -> None:
        """Returns once every rank of the job has called it (a collective)."""
        if self.size > 1:
            collectives.barrier()

    def _configure_devices(self, configure: bool) -> int | None:
        """Pins this rank's GPU (before TF initialises devices); returns its CUDA ordinal."""
        gpus = tf.config.list_physical_devices("GPU")  # does not initialise the runtime
        if not gpus:
            return None
        if configure:
            chosen = devices.configure_local_gpu(tf.config, self.memory, hvd.local_rank(),
                                                 hvd.local_size(),
                                                 tf.config.LogicalDeviceConfiguration)
        else:
            chosen = gpus[hvd.local_rank() % len(gpus)]
        return devices.physical_gpu_ordinal(gpus, chosen)

    def _check_consistent_across_ranks(self) -> None:
        """Fails fast on configuration that would deadlock or silently mis-schedule later."""
        mine = {"group": self.group, "host": socket.gethostname(), "device_key": self.device_key}
        everyone = collectives.allgather_objects(mine) if self.size > 1 else [mine]
        groups = sorted({c["group"] for c in everyone})
        if len(groups) > 1:
            per_rank = ", ".join(f"rank {r}: {c['group']!r}" for r, c in enumerate(everyone))
            raise ValueError("crossover_tf: ranks of one job must use the same crossover group; "
                             f"got {per_rank}")
        seen: dict[tuple[str, str], int] = {}
        for r, c in enumerate(everyone):
            where = (c["host"], c["device_key"])
            if where in seen and self.group:
                raise ValueError(
                    f"crossover_tf: ranks {seen[where]} and {r} of one job share device key "
                    f"{c['device_key']!r} on host {c['host']!r}; they would serialise each "
                    "other. Give each local rank its own device (CROSSOVER_DEVICE_KEY).")
            seen[where] = r

