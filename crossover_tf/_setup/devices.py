"""Which device a rank uses, how much of its memory, and what that device is called physically.

Two TensorFlow processes on one GPU need three things that TensorFlow does not do by default:
memory that leaves room for the peer (TF takes nearly all of it at start-up), each rank pinned
to its own local GPU (the Horovod convention), and a lease key naming the *physical* GPU, so
that two jobs with different CUDA_VISIBLE_DEVICES still pair on the same card.

Everything that decides is a pure function of device descriptions, so it is tested on CPU with
fake devices; the few calls into TensorFlow and the CUDA driver are thin and injectable. The
physical name is the device's UUID, so the MIG slices of one GPU (one PCI bus id) get a lease
each.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import re
import uuid as uuid_lib
from typing import Any, Callable, Protocol, Sequence, TypeVar

from absl import logging

from crossover_tf.lease import segments

DEVICE_KEY_ENV = "CROSSOVER_DEVICE_KEY"
# The setting that leaves GPU pinning and memory to the user (options.DeviceOptions.configure).
_NO_PINNING = "device=crossover_tf.DeviceOptions(configure=False)"
T = TypeVar("T")
N = TypeVar("N")


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
            f"model, or pass {_NO_PINNING} and call "
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
                            "(%s leaves pinning to you)", len(logical_gpus), _NO_PINNING)
        return logical_gpus[0].name
    if logical_cpus:
        return logical_cpus[local_rank % len(logical_cpus)].name
    return "/CPU:0"



def allreduce_device(placement: str, crossing: bool, local_device: str) -> str | None:
    """Where the gradient allreduce runs: "/CPU:0" (Gloo on host memory) or None (next to
    the gradients: NCCL on a GPU when Horovod was built with it).

    auto picks host memory for a crossover group on a GPU: NCCL's kernels would run on the
    GPU, in this job's CUDA context, exactly while the peer computes there (without MPS the
    contexts time-slice; with MPS they still take SMs), defeating the crossing. Gloo leaves
    the GPU to the peer and costs copies over PCIe and a host-side sum, small next to the
    network time that crossing is meant for. Without a group nothing is crossed, so the
    tensors' own device (NCCL) is the faster choice. placement was checked where it was
    given (options.CommunicationOptions).
    """
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


class GpuIdentityError(RuntimeError):
    """The driver could not say which physical device an ordinal is; the reason goes into the
    log and the lease key falls back to a coarser name."""


@dataclasses.dataclass(frozen=True)
class DeviceUuid:
    """A CUDA device's 16-byte UUID, the one identity that tells MIG slices apart (they share
    their GPU's PCI bus id). mig: whether it names a MIG instance; None when the driver could
    not tell, which changes only the key's label, never which devices share a key."""
    raw: bytes
    mig: bool | None

    def __post_init__(self) -> None:
        if len(self.raw) != 16 or not any(self.raw):
            raise ValueError(f"not a device UUID: {self.raw!r}")

    @property
    def kind(self) -> str:
        return {True: "mig", False: "gpu", None: "dev"}[self.mig]

    def names(self) -> tuple[str, ...]:
        """The UUID as nvidia-smi -L and NVML spell it (MIG-... or GPU-...); both spellings
        when it is not known which."""
        text = str(uuid_lib.UUID(bytes=self.raw))
        prefixes = {True: ("MIG",), False: ("GPU",), None: ("GPU", "MIG")}[self.mig]
        return tuple(f"{prefix}-{text}" for prefix in prefixes)


def uuid_from_driver(current: bytes, legacy: bytes | None) -> DeviceUuid:
    """The UUID from cuDeviceGetUuid_v2 (current), classified by cuDeviceGetUuid (legacy).

    On a MIG instance v2 returns the instance's own UUID (CUDA 11.4+ documents it so), while
    the legacy entry point, kept for older callers, still reports the parent GPU's; so the two
    differ exactly on MIG instances. Without the legacy entry point it cannot be told."""
    return DeviceUuid(bytes(current), None if legacy is None else bytes(legacy) != bytes(current))


def key_from_uuid(device: DeviceUuid) -> str:
    """A lease key from a device UUID: "mig-"/"gpu-"/"dev-" and the UUID's leading hex digits,
    as many as the key length allows (28 of 32, i.e. 112 of 128 bits), in the order nvidia-smi
    prints them, so an operator can match a key to `nvidia-smi -L` by eye.

    Keys only need to differ among the devices of one host (they name segments in one lease
    directory): at most a few dozen (8 GPUs x 7 MIG slices). NVIDIA's UUIDs are random or
    SHA-1 derived (MIG), so at least 106 of the kept bits vary; a collision among n devices has
    probability below n^2 / 2^107, about 2e-29 for 56 devices."""
    prefix = f"{device.kind}-"
    key = prefix + device.raw.hex()[:segments.DEVICE_KEY_MAX_LEN - len(prefix)]
    return segments.validate_name("device key", key, segments.DEVICE_KEY_MAX_LEN)


class GpuIdentity(Protocol):
    """Who a CUDA device ordinal (the order TensorFlow lists GPUs in) is physically; each
    method raises GpuIdentityError saying why when the driver cannot tell."""

    def uuid(self, ordinal: int) -> DeviceUuid: ...
    def pci_bus_id(self, ordinal: int) -> str: ...


class CudaDriver:
    """The CUDA driver API through ctypes: cuInit creates no context and takes no device
    memory, unlike asking TensorFlow (which only reports bus ids once its devices exist).
    load: how the library is opened (a fake library stands in for it in tests)."""

    def __init__(self, library: str = "libcuda.so.1",
                 load: Callable[[str], Any] = ctypes.CDLL):
        self._library = library
        self._open = load
        self._cuda: Any = None

    def _load(self) -> Any:
        if self._cuda is None:
            try:
                cuda = self._open(self._library)
            except OSError as err:
                raise GpuIdentityError(f"CUDA driver {self._library} not loadable ({err})") \
                    from err
            self._check(cuda.cuInit(0), "cuInit")
            self._cuda = cuda
        return self._cuda

    @staticmethod
    def _check(result: int, call: str) -> None:
        if result != 0:
            raise GpuIdentityError(f"{call} returned CUDA error {result}")

    def _device(self, ordinal: int) -> tuple[Any, int]:
        cuda = self._load()
        device = ctypes.c_int()
        self._check(cuda.cuDeviceGet(ctypes.byref(device), ordinal), f"cuDeviceGet({ordinal})")
        return cuda, device.value

    def _read_uuid(self, cuda: Any, entry_point: str, device: int) -> bytes:
        function = getattr(cuda, entry_point, None)
        if function is None:
            raise GpuIdentityError(f"{self._library} has no {entry_point} (a driver older "
                                   "than CUDA 11.4)")
        buf = (ctypes.c_ubyte * 16)()
        self._check(function(buf, device), entry_point)
        return bytes(buf)

    def uuid(self, ordinal: int) -> DeviceUuid:
        cuda, device = self._device(ordinal)
        current = self._read_uuid(cuda, "cuDeviceGetUuid_v2", device)
        try:
            legacy: bytes | None = self._read_uuid(cuda, "cuDeviceGetUuid", device)
        except GpuIdentityError as err:
            logging.info("crossover_tf: cannot tell whether GPU %d is a MIG instance (%s)",
                         ordinal, err)
            legacy = None
        try:
            return uuid_from_driver(current, legacy)
        except ValueError as err:
            raise GpuIdentityError(str(err)) from err

    def pci_bus_id(self, ordinal: int) -> str:
        cuda, device = self._device(ordinal)
        buf = ctypes.create_string_buffer(64)
        self._check(cuda.cuDeviceGetPCIBusId(buf, len(buf), device), "cuDeviceGetPCIBusId")
        return buf.value.decode()


def _identify(identity: GpuIdentity | None, what: str, read: Callable[[GpuIdentity], T],
              name: Callable[[T], N]) -> tuple[N | None, str]:
    """One way of naming a device: (name, "") or (None, why not)."""
    if identity is None:
        return None, f"{what}: no CUDA driver asked"
    try:
        return name(read(identity)), ""
    except (GpuIdentityError, ValueError) as err:
        return None, f"{what}: {err}"


def read_device_uuid(identity: GpuIdentity | None, ordinal: int) -> DeviceUuid | None:
    """The UUID of a CUDA ordinal, or None (with the reason logged), e.g. to find the device in
    NVML."""
    found, why = _identify(identity, "UUID", lambda gpu: gpu.uuid(ordinal), lambda uuid: uuid)
    if found is None:
        logging.info("crossover_tf: no UUID for GPU %d (%s)", ordinal, why)
    return found


def device_key(local_rank: int, gpu_ordinal: int | None, identity: GpuIdentity | None,
               env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """Names this rank's device for the lease: $CROSSOVER_DEVICE_KEY if set (launchers that
    emulate hosts), else the device's UUID (a MIG slice has its own), else its PCI bus id, else
    cpu<local_rank> on CPU. Each names the physical device, so jobs that number GPUs
    differently (CUDA_VISIBLE_DEVICES) still pair.

    Each fallback is logged: the PCI bus id is shared by the MIG slices of one GPU, so they
    would take turns needlessly; gpu<local_rank> pairs jobs only if they number GPUs alike.
    """
    override = env.get(DEVICE_KEY_ENV)
    if override:
        return segments.validate_name("device key", override, segments.DEVICE_KEY_MAX_LEN)
    if gpu_ordinal is None:
        return f"cpu{local_rank}"
    ordinal = gpu_ordinal
    key, uuid_failure = _identify(identity, "UUID", lambda gpu: gpu.uuid(ordinal), key_from_uuid)
    if key:
        return key
    key, pci_failure = _identify(identity, "PCI bus id",
                                 lambda gpu: gpu.pci_bus_id(ordinal), key_from_pci_bus_id)
    if key:
        logging.warning("crossover_tf: could not read the UUID of GPU %d (%s); using lease key "
                        "%s from its PCI bus id, which the MIG slices of one GPU share (set %s "
                        "to tell slices apart)", gpu_ordinal, uuid_failure, key, DEVICE_KEY_ENV)
        return key
    logging.warning("crossover_tf: could not identify GPU %d (%s; %s); using lease key gpu%d, "
                    "which pairs jobs only if they number GPUs alike (set %s to the physical "
                    "GPU otherwise)", gpu_ordinal, uuid_failure, pci_failure, local_rank,
                    DEVICE_KEY_ENV)
    return f"gpu{local_rank}"


def physical_gpu_ordinal(gpus: Sequence[Any], chosen: Any) -> int | None:
    """The CUDA ordinal of the chosen physical GPU (its place in TensorFlow's list)."""
    if chosen is None:
        return None
    for ordinal, gpu in enumerate(gpus):
        if gpu == chosen or getattr(gpu, "name", None) == getattr(chosen, "name", object()):
            return ordinal
    raise DeviceConfigError(f"crossover_tf: {chosen} is not among the visible GPUs {gpus}")
