"""TensorFlow's own collective ops as the job's communication backend: no Horovod.

The ranks are the tasks of a TensorFlow cluster, read from a cluster resolver (TF_CONFIG,
Slurm, Kubeflow's TFJob) as MultiWorkerMirroredStrategy reads them. The server is started in
the order MultiWorkerMirroredStrategy uses (collective leader, coordination service, then the
server definition with a copy of the context's config), before any other TensorFlow op runs:
without the context's config in the server definition the first collective hangs with no
error (../shared/platform-notes.md).

Every collective carries a timeout, so a peer that died or a wrong TF_CONFIG fails the job
instead of hanging it. A grouped allreduce packs the tensors of each dtype into one buffer and
runs one CollectiveReduceV2 per dtype, as Horovod's tensor fusion does. Collectives run in host
memory unless the caller names a GPU (allreduce_on="host" is what a crossover group on a GPU
uses anyway; options refuses "device" for this backend rather than ignore it).

The ranks leave together, the leader last (_leave_together, at exit). TensorFlow's
coordination service, on the leader (task 0), takes a task that sent no heartbeat for its
heartbeat timeout for one that crashed, and a task whose leader is gone fails its next
heartbeat (every half timeout); both log it as an error (`E... tasks are unhealthy`,
`Connection refused`) even when every rank succeeded. Python exits without shutting the
service's agent down (TensorFlow has no call for it), so a task's heartbeats stop only when its
process ends, and a rank done well before its peers (rank 0 saving a model, say) made every
such run end with those lines. Meeting at exit was not enough: a process's teardown after the
meeting is seconds of garbage collection (2 to 37 s seen on 2 busy cores), and when two ended
more than a heartbeat apart the lines came back (3 of 19 runs). So every rank meets the others
at exit, then the leader waits until every other task's process has ended (its server refuses
connections) and only then ends its own: no task heartbeats to a leader that is gone. The
heartbeat timeout is 60 s (TensorFlow's default is 10 s), so the leader's own teardown after
the last peer's end has at least 30 s before the service would take that peer for crashed. A
peer that hangs is still caught by the collectives' timeout, and by the heartbeat within a
minute (a rank whose peer died outside any collective waits at the exit meeting up to that
minute, not 10 s). A rank that leaves on an uncaught exception does not wait: its peers then
fail at once, naming it, as before.

What every rank must do alike: TensorFlow matches collectives by instance key, and the keys
come from a counter as each rank builds its collectives, as MultiWorkerMirroredStrategy's do
(Horovod matches by name instead). Every rank must therefore trace the same steps in the same
order: a step retraced on one rank only (a partial last batch there, rank-dependent Python
around a collective) shifts its keys, and both ranks then fail after collective_timeout_s with
DeadlineExceededError. Even shards (the strategy's distribute_dataset drops the remainder)
keep the traces alike.
"""
from __future__ import annotations

import atexit
import copy
import itertools
import os
import pickle
import socket
import sys
import time
from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf
from absl import logging
from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
from tensorflow.core.protobuf import tensorflow_server_pb2
from tensorflow.python.distribute import multi_worker_util
from tensorflow.python.eager import context

from crossover_tf._communication.communicator import Communicator

# One collective group per device type: TensorFlow fixes a group's device type with its first
# collective, and a later one on another type fails the group ("incompatible device type").
_HOST_GROUP_KEY, _GPU_GROUP_KEY = 1, 2
_COORDINATED_JOBS = ("chief", "worker")
_EXIT_BARRIER = "crossover_tf/exit"
# The coordination service takes a task that sent no heartbeat for this long for a crashed one
# (its agent sends one every half of it). TensorFlow's 10 s let a rank's teardown at exit,
# seconds long on a busy machine, outlast it (module docstring).
_HEARTBEAT_TIMEOUT_S = 60.0
_EXIT_PROBE_S = 0.05  # how often the leader looks, at exit, whether the others have ended


class ClusterError(RuntimeError):
    """The cluster this process was given cannot run a job (says which setting to fix)."""


def default_resolver() -> Any:
    """TF_CONFIG's cluster when it is set (a TFJob or our launcher sets it), else Slurm's
    when this process is a task of a Slurm step, else None (a job of one rank)."""
    from tensorflow.python.distribute.cluster_resolver import TFConfigClusterResolver
    if os.environ.get("TF_CONFIG"):
        return TFConfigClusterResolver()
    if os.environ.get("SLURM_PROCID") is not None and os.environ.get("SLURM_STEP_NUM_TASKS"):
        return slurm_resolver(os.environ)
    return None


def slurm_resolver(env: Mapping[str, str]) -> Any:
    """SlurmClusterResolver for this step, set up for crossing:
    - ports from slurm_port_base(), not its fixed 8888: the two jobs of a crossover pair run
      on one node, and the second step's servers would fail to bind the first's ports;
    - one "GPU" slot per task and auto_set_gpu off: its own GPU split needs at least one GPU
      per task (zero GPUs, on a CPU node, is a division by zero in its range()), and the
      strategy pins each rank's GPU itself, by local rank, as under Horovod."""
    from tensorflow.python.distribute.cluster_resolver import SlurmClusterResolver
    from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import (
        expand_tasks_per_node)
    per_node = max(expand_tasks_per_node(env["SLURM_STEP_TASKS_PER_NODE"]))
    return SlurmClusterResolver(port_base=slurm_port_base(env), gpus_per_node=per_node,
                                gpus_per_task=1, auto_set_gpu=False)


def slurm_port_base(env: Mapping[str, str]) -> int:
    """The first port of this step's tasks on each node: $CROSSOVER_TF_PORT_BASE, else one of
    2,500 blocks of 16 ports in 20000-59999 picked by job and step id, so that every task of a
    step computes the same one and two steps (two jobs of a pair) rarely meet."""
    if env.get("CROSSOVER_TF_PORT_BASE"):
        return int(env["CROSSOVER_TF_PORT_BASE"])
    job, step = int(env.get("SLURM_JOB_ID", "0")), int(env.get("SLURM_STEP_ID", "0") or 0)
    return 20000 + 16 * ((job * 31 + step) % 2500)


class TensorFlowCommunicator(Communicator):
    """The job's ranks through TensorFlow's collective ops (ring over gRPC between tasks).

    Args:
      cluster_resolver: where the cluster comes from; None: default_resolver().
      timeout_s: the longest any one collective may wait for its peers.

    Reading the cluster runs no TensorFlow op; start() starts this task's server.
    """

    def __init__(self, cluster_resolver: Any = None, timeout_s: float = 600.0) -> None:
        self.timeout_s = float(timeout_s)
        self._keys = itertools.count(1)  # instance keys: every rank builds the same sequence
        resolver = cluster_resolver if cluster_resolver is not None else default_resolver()
        self._rank, self._size, self._local_rank, self._local_size = 0, 1, 0, 1
        self._server: tuple[Any, ...] | None = None
        self._task: tuple[str, int] | None = None
        if resolver is None:
            return
        spec = multi_worker_util.normalize_cluster_spec(resolver.cluster_spec())
        task_type, task_id = resolver.task_type, resolver.task_id
        if task_type not in _COORDINATED_JOBS or task_id is None:
            raise ClusterError(f"crossover_tf: this task is {task_type!r}/{task_id!r}; a "
                               "training rank must be a 'chief' or 'worker' task (TF_CONFIG's "
                               "task)")
        self._size = multi_worker_util.worker_count(spec, task_type)
        self._rank = multi_worker_util.id_in_cluster(spec, task_type, task_id)
        self._local_rank, self._local_size = _local_coordinates(spec, self._rank)
        self._task = (task_type, int(task_id))
        self._server = ((resolver, spec, task_type, task_id, self.timeout_s)
                        if self._size > 1 else None)
        # The coordination service's leader outlives the other tasks at exit: their addresses.
        self._outlive: list[str] = []
        leader = multi_worker_util.coordination_leader(spec)
        if leader == f"/job:{task_type}/replica:0/task:{task_id}":
            self._outlive = [address for job in _COORDINATED_JOBS if job in spec.jobs
                             for i, address in enumerate(spec.job_tasks(job))
                             if (job, i) != self._task]

    def start(self) -> None:
        if self._server is not None:
            _start_server(*self._server)
            self._server = None
            atexit.register(_leave_together, os.getpid(), self.timeout_s, self._outlive)

    def __repr__(self) -> str:
        return f"TensorFlowCommunicator(rank={self.rank}, size={self.size})"

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    @property
    def local_rank(self) -> int:
        return self._local_rank

    @property
    def local_size(self) -> int:
        return self._local_size

    def own_devices(self, devices: Sequence[Any]) -> list[Any]:
        # With the server up, the eager context lists every task's devices; ours first.
        if self._task is None:
            return list(devices)
        task_type, task_id = self._task
        specs = [(d, tf.DeviceSpec.from_string(d.name)) for d in devices]
        return [d for d, spec in specs
                if spec.job in (None, task_type) and spec.task in (None, task_id)]

    def allreduce(self, tensors: Sequence[tf.Tensor], *, mean: bool, name: str,
                  device: str | None = None, compress: bool = False) -> list[tf.Tensor]:
        # compress: this backend has no gradient compression; the tensors go as they are.
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        if self.size == 1:
            return [tf.identity(t) for t in tensors]
        device, group_key = _placement(device)
        with tf.device(device):
            out: list[tf.Tensor | None] = [None] * len(tensors)
            for dtype in dict.fromkeys(t.dtype for t in tensors):
                indices = [i for i, t in enumerate(tensors) if t.dtype == dtype]
                flat = tf.concat([tf.reshape(tensors[i], [-1]) for i in indices], axis=0)
                reduced = tf.raw_ops.CollectiveReduceV2(
                    input=flat, group_size=self.size, group_key=group_key,
                    instance_key=next(self._keys), ordering_token=[], merge_op="Add",
                    final_op="Div" if mean else "Id", communication_hint="ring",
                    timeout_seconds=self.timeout_s, name=name)
                sizes = [tf.size(tensors[i]) for i in indices]
                for i, part in zip(indices, tf.split(reduced, sizes)):
                    out[i] = tf.reshape(part, tf.shape(tensors[i]))
        return out  # type: ignore[return-value]

    def broadcast(self, tensor: tf.Tensor, root_rank: int, name: str) -> tf.Tensor:
        tensor = tf.convert_to_tensor(tensor)
        if self.size == 1:
            return tf.identity(tensor)
        device, group_key = _placement(None)
        common = dict(group_size=self.size, group_key=group_key,
                      instance_key=next(self._keys), communication_hint="ring",
                      timeout_seconds=self.timeout_s, name=name)
        with tf.device(device):
            if self.rank == root_rank:
                return tf.raw_ops.CollectiveBcastSendV2(input=tensor, **common)
            return tf.raw_ops.CollectiveBcastRecvV2(shape=tf.shape(tensor), T=tensor.dtype,
                                                    **common)

    def allgather_object(self, obj: Any, name: str) -> list[Any]:
        if self.size == 1:
            return [obj]
        data = pickle.dumps(obj)
        # The gather stacks rows in the group's order, which TensorFlow sorts by task name
        # (task:10 before task:2): each row says whose it is, and the rows are put in rank order.
        heads = self._gather(tf.constant([[self.rank, len(data)]], tf.int64),
                             f"{name}_lengths").numpy()
        order = np.argsort(heads[:, 0])
        # The gather takes no bytes: the pickles go as int32 words, padded to the longest.
        padded = np.zeros(-(-int(heads[:, 1].max()) // 4) * 4, np.uint8)
        padded[:len(data)] = np.frombuffer(data, np.uint8)
        rows = self._gather(tf.constant(padded.view(np.int32)[np.newaxis]), name).numpy()
        return [pickle.loads(rows[r].view(np.uint8)[:heads[r, 1]].tobytes()) for r in order]

    def _gather(self, tensor: tf.Tensor, name: str) -> tf.Tensor:
        """Every rank's tensor stacked along axis 0, in the group's order (same shapes)."""
        device, group_key = _placement(None)
        with tf.device(device):
            return tf.raw_ops.CollectiveGatherV2(
                input=tensor, group_size=self.size, group_key=group_key,
                instance_key=next(self._keys), ordering_token=[], communication_hint="ring",
                timeout_seconds=self.timeout_s, name=name)


def _leave_together(pid: int, timeout_s: float, outlive: Sequence[str] = ()) -> None:
    """At exit: waits (up to timeout_s, the collectives' own bound) until every rank of the job
    is exiting too; then the coordination service's leader (outlive: the other tasks'
    addresses) waits until the others' processes have ended, so that it ends last: the service
    then logs no error on a run that succeeded (module docstring). That wait is bounded by the
    heartbeat timeout too (a forked child holding a peer's listening socket would keep it
    open). A rank failing with an uncaught exception leaves at once instead: its peers, perhaps
    waiting for it in a collective, fail now, naming it, rather than after the timeout."""
    if os.getpid() != pid:  # a forked child that inherited the hook is no rank
        return
    if getattr(sys, "last_value", None) is not None:  # set before atexit runs, by the traceback
        return
    try:
        context.context().wait_at_barrier(_EXIT_BARRIER, int(timeout_s * 1000))
    except Exception as err:  # a peer that failed, is gone or is late: leave anyway
        logging.warning("crossover_tf: leaving without every rank (waited at exit up to %s s: "
                        "%s)", timeout_s, (str(err).splitlines() or [type(err).__name__])[0])
        return
    bound_s = min(timeout_s, _HEARTBEAT_TIMEOUT_S)
    deadline = time.monotonic() + bound_s
    pending = list(outlive)
    while pending:
        pending = [address for address in pending if _still_running(address)]
        if pending and time.monotonic() > deadline:
            logging.warning("crossover_tf: leaving before the tasks at %s ended (waited at exit "
                            "%s s)", ", ".join(pending), bound_s)
            return
        if pending:
            time.sleep(_EXIT_PROBE_S)


def _still_running(address: str) -> bool:
    """Whether the task at address ("host:port") still runs: its server accepts a connection
    (closed at once, nothing sent). Its process ends with its server: TensorFlow never stops
    one. Refused, or a host that cannot be reached: it has ended, or cannot be watched."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0):
            return True
    except OSError:
        return False


def _placement(device: str | None) -> tuple[str, int]:
    """Where a collective runs and its group: on a GPU only when the caller names one (the
    gradients' allreduce_device), else in host memory. Every rank must place a collective
    alike, which explicit placement guarantees and inheriting the tensors' device would not
    (a rank's logical CPU, or a GPU variable beside a CPU metric)."""
    if device is not None and tf.DeviceSpec.from_string(device).device_type == "GPU":
        return device, _GPU_GROUP_KEY
    return "/CPU:0", _HOST_GROUP_KEY


def _local_coordinates(spec: Any, rank: int) -> tuple[int, int]:
    """(local rank, local size): the ranks whose address has this rank's host, in rank order."""
    hosts = [address.rsplit(":", 1)[0] for job in _COORDINATED_JOBS if job in spec.jobs
             for address in spec.job_tasks(job)]
    mine = hosts[rank]
    return hosts[:rank].count(mine), hosts.count(mine)


def _start_server(resolver: Any, spec: Any, task_type: str, task_id: int,
                  timeout_s: float) -> None:
    """Starts this task's server and enables collective ops (MultiWorkerMirroredStrategy's
    order). Must run before any other TensorFlow op: a started context cannot take it."""
    ctx = context.context()
    ctx.configure_collective_ops(
        collective_leader=multi_worker_util.collective_leader(spec, task_type, task_id),
        device_filters=(f"/job:{task_type}/task:{task_id}",))
    if ctx.coordination_service is None:
        ctx.configure_coordination_service(
            service_type="standalone",
            service_leader=multi_worker_util.coordination_leader(spec),
            # Its default is an hour: a peer that never starts (a wrong TF_CONFIG) must fail
            # the job within the collectives' own timeout instead.
            cluster_register_timeout_in_ms=int(timeout_s * 1000),
            heartbeat_timeout_in_ms=int(_HEARTBEAT_TIMEOUT_S * 1000),
            coordinated_jobs=[coordination_config_pb2.CoordinatedJob(
                name=job, num_tasks=spec.num_tasks(job))
                for job in _COORDINATED_JOBS if job in spec.jobs])
    config = copy.deepcopy(ctx.config)
    config.experimental.collective_group_leader = multi_worker_util.collective_leader(
        spec, task_type, task_id)
    server_def = tensorflow_server_pb2.ServerDef(
        cluster=spec.as_cluster_def(), default_session_config=config, job_name=task_type,
        task_index=task_id, protocol=getattr(resolver, "rpc_layer", None) or "grpc",
        port=getattr(resolver, "port", 0) or 0)
    ctx.enable_collective_ops(server_def)
    ctx.ensure_initialized()
