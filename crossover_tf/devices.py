"""Which device a rank uses, how much of its memory, and what that device is called physically.

Two TensorFlow processes on one GPU need three things that TensorFlow does not do by default:
memory that leaves room for the peer (TF takes nearly all of it at start-up), each rank pinned
to its own local GPU (the Horovod convention), and a lease key naming the *physical* GPU, so
that two jobs with different CUDA_VISIBLE_DEVICES still pair on the same card.

Everything that decides is a pure function of device descriptions, so it is tested on CPU with
fake devices; the few calls into TensorFlow and the CUDA driver are thin and injectable.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import re
from typing import Any, Protocol, Sequence

from absl import logging

from crossover_tf.lease import segments

DEVICE_KEY_ENV = "CROSSOVER_DEVICE_KEY"


class DeviceConfigError(RuntimeError):
    """Device configuration that cannot work, said in a way that tells the user what to do."""


@dataclasses.dataclass(frozen=True)
class GpuMemoryPolicy:
    """How much GPU memory a job may take. growth: allocate as needed (TF's allow_growth), so
    two jobs fit as long as their peaks do; limit_mb: a hard cap, for predictable sharing."""
    growth: bool = True
    limit_mb: int | None = None

    def __post_init__(self) -> None:
        if self.limit_mb is not None:
            if isinstance(self.limit_mb, bool) or not isinstance(self.limit_mb, int) \
                    or self.limit_mb <= 0:
                raise ValueError(f"crossover_tf: memory_limit_mb must be a positive whole "
                                 f"number of MiB, got {self.limit_mb!r}")
            if self.growth:
                raise ValueError("crossover_tf: choose memory growth or a memory limit, not both "
                                 "(TensorFlow refuses growth on a device with a limit)")


class TfConfig(Protocol):
    """The part of tf.config that device setup uses (a fake stands in for it in tests)."""

    def list_physical_devices(self, device_type: str) -> list[Any]: ...
    def set_visible_devices(self, devices: list[Any], device_type: str) -> None: ...
    def set_logical_device_configuration(self, device: Any, configs: list[Any]) -> None: ...
    def list_logical_devices(self, device_type: str) -> list[Any]: ...


def select_local_gpu(gpus: Sequence[Any], local_rank: int, local_size: int) -> Any:
    """Local rank i uses GPU i, as Horovod's examples do; more local ranks than GPUs would put
    two ranks of one job on one GPU, which serialises them, so that is an error."""
    if not gpus:
        raise DeviceConfigError("crossover_tf: no GPU is visible to this process")
    if local_size > len(gpus):
        raise DeviceConfigError(
            f"crossover_tf: {local_size} ranks of this job run on this host but only "
            f"{len(gpus)} GPU(s) are visible ({[getattr(g, 'name', g) for g in gpus]}); "
            "start at most one rank per GPU (horovodrun -H host:<number of GPUs>)")
    if not 0 <= local_rank < local_size:
        raise DeviceConfigError(f"crossover_tf: local rank {local_rank} is outside "
                                f"[0, {local_size})")
    return gpus[local_rank]


def configure_local_gpu(tf_config: TfConfig, memory: GpuMemoryPolicy, local_rank: int,
                        local_size: int, logical_device_configuration: Any = None) -> Any:
    """Pins this rank to its GPU and applies the memory policy; returns the physical GPU, or
    None on a machine without GPUs. Must run before TensorFlow initialises its devices (the
    first op, tensor or model does that)."""
    gpus = tf_config.list_physical_devices("GPU")
    if not gpus:
        return None
    gpu = select_local_gpu(gpus, local_rank, local_size)
    try:
        tf_config.set_visible_devices([gpu], "GPU")
        if memory.limit_mb is not None:
            tf_config.set_logical_device_configuration(
                gpu, [logical_device_configuration(memory_limit=memory.limit_mb)])
        elif memory.growth:
            tf_config.experimental.set_memory_growth(gpu, True)
    except RuntimeError as err:
        raise DeviceConfigError(
            "crossover_tf: TensorFlow has already initialised its devices, so the GPU can no "
            "longer be pinned or its memory limited (the second job on the GPU would then run "
            "out of memory). Construct CrossoverStrategy before creating any tensor, op or "
            "model, or pass configure_devices=False and call "
            "tf.config.set_visible_devices / experimental.set_memory_growth yourself. "
            f"TensorFlow said: {err}") from err
    return gpu


def local_device_name(logical_gpus: Sequence[Any], logical_cpus: Sequence[Any],
                      local_rank: int) -> str:
    """The device this rank's ops go on. With its GPU pinned, a rank sees exactly one logical
    GPU. Without GPUs, logical CPUs (a CPU split into several, as tests and the emulated
    cluster do) are handed out by local rank like GPUs."""
    if logical_gpus:
        if len(logical_gpus) > 1:
            logging.warning("crossover_tf: %d GPUs visible to one rank; using the first "
                            "(configure_devices=False leaves pinning to you)", len(logical_gpus))
        return logical_gpus[0].name
    if logical_cpus:
        return logical_cpus[local_rank % len(logical_cpus)].name
    return "/CPU:0"


ALLREDUCE_PLACEMENTS = ("auto", "host", "device")


def allreduce_device(placement: str, crossing: bool, local_device: str) -> str | None:
    """Where the gradient allreduce runs: "/CPU:0" (Gloo on host memory) or None (next to
    the gradients: NCCL on a GPU when Horovod was built with it).

    auto picks host memory for a crossover group on a GPU: NCCL's kernels would run on the
    GPU, in this job's CUDA context, exactly while the peer computes there (without MPS the
    contexts time-slice; with MPS they still take SMs), defeating the crossing. Gloo leaves
    the GPU to the peer and costs copies over PCIe and a host-side sum, small next to the
    network time that crossing is meant for. Without a group nothing is crossed, so the
    tensors' own device (NCCL) is the faster choice.
    """
    if placement not in ALLREDUCE_PLACEMENTS:
        raise ValueError(f"crossover_tf: allreduce_on must be one of {ALLREDUCE_PLACEMENTS}, "
                         f"got {placement!r}")
    if placement == "host":
        return "/CPU:0"
    if placement == "device":
        return None
    return "/CPU:0" if crossing and "GPU" in local_device.upper() else None


_PCI_BUS_ID = re.compile(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")


def key_from_pci_bus_id(bus_id: str) -> str:
    """A lease key from a PCI bus id ("0000:3B:00.0" -> "pci-0000-3b-00-0"): the same for every
    process that uses the card, however CUDA_VISIBLE_DEVICES numbers it."""
    match = _PCI_BUS_ID.fullmatch(bus_id.strip())
    if not match:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    domain, bus, device, function = match.groups()
    key = f"pci-{int(domain, 16):04x}-{bus.lower()}-{device.lower()}-{function}"
    return segments.validate_name("device key", key, segments.DEVICE_KEY_MAX_LEN)


class GpuIdentity(Protocol):
    """Reports the PCI bus id of a CUDA device ordinal (the order TensorFlow lists GPUs in)."""

    def pci_bus_id(self, ordinal: int) -> str | None: ...


class CudaDriver:
    """The CUDA driver API through ctypes: cuInit creates no context and takes no device
    memory, unlike asking TensorFlow (which only reports bus ids once its devices exist)."""

    def __init__(self, library: str = "libcuda.so.1"):
        self._library = library
        self._cuda: Any = None

    def _load(self) -> Any:
        if self._cuda is None:
            cuda = ctypes.CDLL(self._library)
            if cuda.cuInit(0) != 0:
                raise OSError("cuInit failed")
            self._cuda = cuda
        return self._cuda

    def pci_bus_id(self, ordinal: int) -> str | None:
        try:
            cuda = self._load()
        except OSError as err:
            logging.warning("crossover_tf: CUDA driver not usable (%s)", err)
            return None
        device = ctypes.c_int()
        buf = ctypes.create_string_buffer(64)
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
            return None
        if cuda.cuDeviceGetPCIBusId(buf, len(buf), device) != 0:
            return None
        return buf.value.decode()


def device_key(local_rank: int, gpu_ordinal: int | None, identity: GpuIdentity | None,
               env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """Names this rank's device for the lease: $CROSSOVER_DEVICE_KEY if set (launchers that
    emulate hosts, MIG slices), else the GPU's PCI bus id, else cpu<local_rank> on CPU.

    Falling back to gpu<local_rank> is only right when every job on the host numbers GPUs the
    same way, so it is logged.
    """
    override = env.get(DEVICE_KEY_ENV)
    if override:
        return segments.validate_name("device key", override, segments.DEVICE_KEY_MAX_LEN)
    if gpu_ordinal is None:
        return f"cpu{local_rank}"
    bus_id = identity.pci_bus_id(gpu_ordinal) if identity is not None else None
    if bus_id:
        return key_from_pci_bus_id(bus_id)
    logging.warning("crossover_tf: could not read the PCI bus id of GPU %d; using lease key "
                    "gpu%d, which pairs jobs only if they number GPUs alike (set %s to the "
                    "physical GPU otherwise)", gpu_ordinal, local_rank, DEVICE_KEY_ENV)
    return f"gpu{local_rank}"


def physical_gpu_ordinal(gpus: Sequence[Any], chosen: Any) -> int | None:
    """The CUDA ordinal of the chosen physical GPU (its place in TensorFlow's list)."""
    if chosen is None:
        return None
    for ordinal, gpu in enumerate(gpus):
        if gpu == chosen or getattr(gpu, "name", None) == getattr(chosen, "name", object()):
            return ordinal
    raise DeviceConfigError(f"crossover_tf: {chosen} is not among the visible GPUs {gpus}")
