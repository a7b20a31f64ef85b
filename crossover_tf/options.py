"""CrossoverStrategy's options, in four small groups beside the group name.

Why groups: the strategy's settings answer four separate questions (which device and how much of its
memory; how the jobs of a group share it; in what order their allreduces use the network; how the
job's ranks talk), and a flat list of knobs let settings that only make sense together be given
apart and silently dropped. Each group is frozen and checks itself when it is made, and a
combination that would be dropped (a reservation without the primary priority, say) is refused
there, before Horovod or TensorFlow start."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

from crossover_tf.lease import segments
from crossover_tf.lease.device_lease import (validate_priority, validate_reserve,
                                             validate_timeout)
from crossover_tf.lease.group_join import validate_join_timeout, validate_jobs
from crossover_tf.lease.membership import validate_job
from crossover_tf.lease.link_turn import validate_link_turn, validate_link_turn_priority

DEFAULT_PRIMARY_RESERVE_S = 0.05
MEMORY_MODES = ("growth", "all")

# Where the gradient allreduce may run (_setup.devices.allreduce_device picks within them).
ALLREDUCE_PLACEMENTS = ("auto", "host", "device")


@dataclasses.dataclass(frozen=True)
class DeviceOptions:
    """Which device each rank uses and how much of its memory.

    Args:
      device_key: name of this process's device on its host; default $CROSSOVER_DEVICE_KEY,
        else the physical device's identity (a GPU's UUID or PCI bus id), else gpu<n>/cpu<n>.
      configure: pin each rank to its local GPU and apply `memory`. This must happen before
        TensorFlow initialises its devices, so construct the strategy before creating any
        tensor or model; False leaves GPU setup to you.
      memory: "growth" (allocate as needed, so the peer job gets the rest; the default),
        "all" (TensorFlow's own default: nearly the whole GPU at start-up, leaving the peer
        nothing) or a whole number of MiB this job may take at most (predictable sharing).
    """
    device_key: str | None = None
    configure: bool = True
    memory: str | int = "growth"

    def __post_init__(self) -> None:
        if self.device_key is not None:
            segments.validate_name("device key", self.device_key, segments.DEVICE_KEY_MAX_LEN)
        if isinstance(self.memory, str):
            if self.memory not in MEMORY_MODES:
                raise ValueError(f"crossover_tf: DeviceOptions.memory must be one of "
                                 f"{MEMORY_MODES} or a number of MiB, got {self.memory!r}")
        elif isinstance(self.memory, bool) or not isinstance(self.memory, int) \
                or self.memory <= 0:
            raise ValueError(f"crossover_tf: DeviceOptions.memory as a limit must be a "
                             f"positive whole number of MiB, got {self.memory!r}")

    @property
    def memory_growth(self) -> bool:
        return self.memory == "growth"

    @property
    def memory_limit_mb(self) -> int | None:
        return self.memory if isinstance(self.memory, int) else None


@dataclasses.dataclass(frozen=True)
class LeaseOptions:
    """How the jobs of a crossover group share each device.

    Args:
      jobs: how many jobs the group has. At start each job waits (up to join_timeout_s) until
        that many jobs are on its device's lease, and fails otherwise: jobs that cannot see
        each other's lease (a container's own /dev/shm) would both compute at once, and that
        must never pass in silence. A job meant to run alone (a profiling run, say) says 1.
        Link turns use the same count.
      join_timeout_s: the longest a job waits at start for the group's other jobs.
      timeout_s: how long one acquire of the device may wait before failing (a stuck or dead
        peer).
      priority: "normal" (jobs take turns, FIFO), "primary" (never queues behind a secondary,
        and keeps secondaries out for primary_reserve_s after each step so they do not start
        work it would wait for) or "secondary" (fills the primary's gaps).
      primary_reserve_s: a primary's step-end reservation; only a primary has one
        (default 0.05 s for a primary).
      lease_dir: where the lease segments live: a tmpfs or local directory that every job of
        the group sees (a volume shared by the containers); default $CROSSOVER_LEASE_DIR,
        else /dev/shm. A network file system is refused (its locks do not work across hosts).
      shared_group: jobs of several users: segment files are 0660 and belong to the lease
        directory's group (docs/deploying.md); default $CROSSOVER_LEASE_SHARED_GROUP=1, else
        off.
      job: this job's name on the lease (what `python -m crossover_tf.lease status` shows);
        default from rank 0's host and pid.
    """
    jobs: int = 2
    join_timeout_s: float = 120.0
    timeout_s: float = 600.0
    priority: str = "normal"
    primary_reserve_s: float | None = None
    lease_dir: str | None = None
    shared_group: bool | None = None
    job: str | None = None

    def __post_init__(self) -> None:
        validate_jobs(self.jobs)
        validate_job(self.job)
        validate_join_timeout(self.join_timeout_s)
        validate_timeout(self.timeout_s)
        validate_priority(self.priority)
        if self.primary_reserve_s is not None:
            if self.priority != "primary":
                raise ValueError(
                    f"crossover_tf: primary_reserve_s is the step-end reservation of a "
                    f"primary; priority {self.priority!r} has none (it would be ignored)")
            validate_reserve(self.primary_reserve_s)

    @property
    def step_end_reserve_s(self) -> float:
        """How long a step-end yield keeps lower classes out (0 but for a primary)."""
        if self.priority != "primary":
            return 0.0
        return (DEFAULT_PRIMARY_RESERVE_S if self.primary_reserve_s is None
                else float(self.primary_reserve_s))


@dataclasses.dataclass(frozen=True)
class LinkTurnOptions:
    """This job's place in its group's allreduce order (lease.link_turn says why and why it
    cannot deadlock): the group's jobs run their gradient allreduces one at a time per host.

    Args:
      position: 0, 1, ... — the same on every host and distinct per job, below the group's
        LeaseOptions.jobs.
      wait_s: the longest one allreduce waits for another job's earlier one (a peer paused
        outside a step, e.g. saving a checkpoint); then it runs anyway.
    """
    position: int
    wait_s: float = 10.0

    def __post_init__(self) -> None:
        if isinstance(self.position, bool) or not isinstance(self.position, int) \
                or self.position < 0:
            raise ValueError(f"crossover_tf: LinkTurnOptions.position must be a whole number "
                             f">= 0, got {self.position!r}")
        validate_timeout(self.wait_s)


# The libraries that can move a job's bytes (crossover_tf/_communication/, one module each).
BACKENDS = ("horovod", "tensorflow")
# What CommunicationOptions.backend takes: a library by name, or "auto" (resolve_backend).
BACKEND_CHOICES = ("auto", *BACKENDS)
# A custom loop's gradient buckets (CommunicationOptions.bucket_bytes): at 200 Mbit/s one takes
# ~0.17 s on the wire, so the part left exposed after the backward pass is about one bucket.
DEFAULT_BUCKET_BYTES = 4 << 20
# What a launcher of Horovod ranks puts in each rank's environment: horovodrun's Gloo mode
# sets HOROVOD_RANK; its MPI mode starts the ranks with mpirun, whose ranks have Open MPI's
# OMPI_COMM_WORLD_RANK or MPICH's and Intel MPI's PMI_RANK. Slurm's srun --mpi=pmi2 sets
# PMI_RANK as well, for steps of either backend, so PMI_RANK counts only outside a Slurm step.
GROUP_ENV = "CROSSOVER_GROUP"
HOROVOD_LAUNCHER_ENV = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK")
MPI_PMI_ENV = "PMI_RANK"


def resolve_group(group: str | None, env: Mapping[str, str] | None = None) -> str:
    """The crossover group a CrossoverStrategy(group) means: as given ("" for none), or, for
    None, $CROSSOVER_GROUP ("" where unset). Why a variable: a launcher, a Slurm recipe or a
    TFJob can put a script's jobs in a group without the script growing a flag of its own (a
    ported Horovod script keeps its command line)."""
    if group is not None:
        return group
    value = (os.environ if env is None else env).get(GROUP_ENV, "")
    if value:
        segments.validate_name(f"${GROUP_ENV}", value, segments.GROUP_MAX_LEN)
    return value


def resolve_backend(backend: str, env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(the backend a CommunicationOptions.backend means in this process, why). A library
    named stays as it is. "auto" is Horovod when this process is a rank that horovodrun (or
    the mpirun it runs) started, and TensorFlow's collectives otherwise: ranks from TF_CONFIG
    (`python -m crossover_tf.launch`, a TFJob), a Slurm step, or one rank alone. Why "auto"
    rather than TensorFlow outright: under horovodrun TensorFlow's collectives would find no
    cluster and every rank would train alone, without a word; "auto" keeps those jobs Horovod
    jobs while everything else needs no Horovod install."""
    if backend != "auto":
        return backend, "asked for"
    env = os.environ if env is None else env
    for name in HOROVOD_LAUNCHER_ENV:
        if env.get(name) is not None:
            return "horovod", f"{name} is set: a rank that horovodrun or mpirun started"
    if env.get(MPI_PMI_ENV) is not None and env.get("SLURM_PROCID") is None:
        return "horovod", f"{MPI_PMI_ENV} is set outside Slurm: a rank that mpirun started"
    if env.get("TF_CONFIG"):
        return "tensorflow", "no horovodrun; the ranks come from TF_CONFIG"
    return "tensorflow", ("no horovodrun; the ranks come from Slurm's step, or this process "
                          "is the job's one rank")


@dataclasses.dataclass(frozen=True)
class CommunicationOptions:
    """How the job's ranks talk: Horovod or TensorFlow's own collectives.

    Settings one backend would ignore are refused for the other (compression, init_horovod
    and allreduce_on="device" are Horovod's; cluster_resolver is TensorFlow's), and with
    "auto", which could pick either, they need the backend named; except Horovod's in a rank
    horovodrun started, where "auto" is Horovod.

    Args:
      backend: "auto" (the default: Horovod in a rank that horovodrun started, TensorFlow's
        collectives otherwise; resolve_backend says how it decides, and the strategy logs what
        it picked), "horovod" (ranks from horovodrun, Gloo or NCCL) or "tensorflow" (ranks from
        TF_CONFIG, Slurm's resolver or a TFJob; `python -m crossover_tf.launch` starts local
        ones). The crossing protocol is the same under both.
      compression: Horovod gradient compression (hvd.Compression.none, the default, or .fp16);
        the tensorflow backend has none.
      allreduce_on: "auto" (host memory for a crossover group on GPU, else next to the
        gradients), "host" or "device" (Horovod only: TensorFlow's collectives here run in
        host memory); devices.allreduce_device says why.
      init_horovod: call hvd.init() (Horovod only); with False, Horovod must already be
        initialised.
      cluster_resolver: the tensorflow backend's cluster (a tf.distribute cluster resolver);
        None reads TF_CONFIG, else Slurm's environment, else runs one rank.
      collective_timeout_s: the tensorflow backend's longest wait in one collective (a peer
        that died fails the job after it instead of hanging it), and its ranks' longest wait
        for each other at exit.
      bucket_bytes: in a traced custom-loop step (strategy.gradient_tape, or the optimizer's
        reduction inside strategy.run), the gradients' allreduce goes in buckets of about this
        many bytes, each started as soon as its gradients exist, while the backward pass still
        computes (as Horovod's tape overlaps them); the device is yielded when the backward
        pass ends and only the rest of the allreduce is left to the peer. Under Horovod any
        value above 0 submits each gradient alone, as its tape does, and Horovod's fusion
        buffer makes the buckets. 0: one grouped allreduce after the whole backward pass (the
        Keras train step's, whose compute is one XLA cluster that hands out all its gradients
        at once).
    """
    backend: str = "auto"
    compression: Any = None
    allreduce_on: str = "auto"
    init_horovod: bool = True
    cluster_resolver: Any = None
    collective_timeout_s: float = 600.0
    bucket_bytes: int = DEFAULT_BUCKET_BYTES

    def __post_init__(self) -> None:
        if isinstance(self.bucket_bytes, bool) or not isinstance(self.bucket_bytes, int) \
                or self.bucket_bytes < 0:
            raise ValueError(f"crossover_tf: CommunicationOptions.bucket_bytes must be a whole "
                             f"number >= 0 (0: one allreduce after the backward pass), got "
                             f"{self.bucket_bytes!r}")
        if self.backend not in BACKEND_CHOICES:
            raise ValueError(f"crossover_tf: CommunicationOptions.backend must be one of "
                             f"{BACKEND_CHOICES}, got {self.backend!r}")
        if self.allreduce_on not in ALLREDUCE_PLACEMENTS:
            raise ValueError(f"crossover_tf: allreduce_on must be one of "
                             f"{ALLREDUCE_PLACEMENTS}, got {self.allreduce_on!r}")
        # What to say when a setting of one library meets another choice.
        unless_horovod = ("name backend='horovod' with it (backend='auto' picks TensorFlow's "
                          "collectives outside horovodrun)" if self.backend == "auto" else "")
        # In a rank horovodrun started, "auto" is Horovod and cannot be anything else (TensorFlow's
        # collectives would find no cluster there), so Horovod's settings are used, never
        # dropped: a Horovod script keeps its compression as it was.
        horovod = resolve_backend(self.backend)[0] == "horovod"
        if not horovod and self.compression is not None:
            raise ValueError("crossover_tf: gradient compression is Horovod's; " + (
                unless_horovod or f"the {self.backend} backend sends gradients as they are"))
        if not horovod and self.allreduce_on == "device":
            raise ValueError("crossover_tf: allreduce_on='device' needs backend='horovod'; " + (
                unless_horovod
                or f"the {self.backend} backend's collectives run in host memory"))
        if not horovod and self.init_horovod is not True:
            raise ValueError("crossover_tf: init_horovod is Horovod's; " + (
                unless_horovod or f"the {self.backend} backend starts its own collectives"))
        if self.backend != "tensorflow" and self.cluster_resolver is not None:
            raise ValueError("crossover_tf: cluster_resolver is for backend='tensorflow'; " + (
                "name that backend with it (backend='auto' picks Horovod under horovodrun)"
                if self.backend == "auto" else "Horovod's ranks come from horovodrun"))
        validate_timeout(self.collective_timeout_s)

    def resolved_backend(self, env: Mapping[str, str] | None = None) -> str:
        """The library this process uses: backend, with "auto" resolved (resolve_backend)."""
        return resolve_backend(self.backend, env)[0]


def validate_micro_batches(micro_batches: Any) -> None:
    """micro_batches (strategy.callbacks, strategy.prepare): a whole number >= 1."""
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) \
            or micro_batches < 1:
        raise ValueError(f"crossover_tf: micro_batches must be a whole number >= 1, got "
                         f"{micro_batches!r}")


def check_combination(group: str, lease: LeaseOptions, link_turn: LinkTurnOptions | None
                      ) -> None:
    """Refuses settings that only make sense together when given apart."""
    if link_turn is None:
        return
    if not group:
        raise ValueError("crossover_tf: link turns order the allreduces of a crossover "
                         "group's jobs; they need a group")
    validate_link_turn(link_turn.position, lease.jobs)  # jobs: the group's, LeaseOptions.jobs
    validate_link_turn_priority(lease.priority)

