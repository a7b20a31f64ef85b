"""Who else computes on this rank's GPU: processes outside the crossover group, seen by NVML.

The lease only serialises the jobs that join it. A job that cannot see the lease (another
container's /dev/shm, a different lease directory or device key) or that does not use
crossover_tf at all computes at the same time as the group, and nothing else would say so.
NVML lists the processes with a context on the device; any that is not a lease member is an
outsider.

NVML reports pids in the host's PID namespace, while each member recorded its pid in its own.
A pid is compared only where the two namespaces are known to be one (both the host's); for the
other members only counting is sound: more device processes than members that could account
for them means at least that many outsiders. So the check may be partial, but never warns
about a member.

The decision is a pure function of process lists (tested with fakes); the NVML reader is a
thin ctypes layer over libnvidia-ml.so.1 that can be replaced.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
from typing import Any, Callable, Protocol, Sequence

from absl import logging

from crossover_tf._setup.devices import DeviceUuid

# The init PID namespace's inode number is a kernel constant (PROC_PID_INIT_INO), the same on
# every Linux host; a process that sees it in /proc/self/ns/pid shares NVML's pids.
HOST_PID_NAMESPACE = 0xEFFFFFFC


class GpuProcessReadError(RuntimeError):
    """NVML could not list the device's processes (absent, no permission, device not found)."""


@dataclasses.dataclass(frozen=True)
class GpuProcess:
    """A process with a context on the device, as NVML reports it: pid in the host's PID
    namespace; used_memory_bytes None where NVML cannot tell (e.g. MIG without privileges)."""
    pid: int
    used_memory_bytes: int | None = None

    def describe(self) -> str:
        memory = ("memory unknown" if self.used_memory_bytes is None
                  else f"{self.used_memory_bytes / 2**20:.0f} MiB")
        return f"pid {self.pid} ({memory})"


class LeaseMember(Protocol):
    """What the check needs of a lease member (crossover_tf.lease's Member has these)."""

    @property
    def pid(self) -> int: ...

    @property
    def pid_ns(self) -> int: ...


@dataclasses.dataclass(frozen=True)
class OutsiderCheck:
    """The comparison's result. unmatched: device processes that no member's pid accounts for.
    uncomparable_members: members whose pid NVML cannot show (another PID namespace), each of
    which may be one of the unmatched."""
    unmatched: tuple[GpuProcess, ...]
    uncomparable_members: int

    @property
    def complete(self) -> bool:
        """Every member was compared by pid, so the unmatched are exactly the outsiders."""
        return self.uncomparable_members == 0

    @property
    def outsider_count(self) -> int:
        """How many outsiders there are at least."""
        return max(0, len(self.unmatched) - self.uncomparable_members)

    @property
    def outsiders(self) -> tuple[GpuProcess, ...]:
        """The outsiders by name; empty when the check could only count them."""
        return self.unmatched if self.complete else ()


def nvml_pid_namespace(own_pid_ns: int) -> int | None:
    """The PID namespace NVML's pids are in, as far as this process can know it: the host's,
    which it can name only when it is in it itself."""
    return own_pid_ns if own_pid_ns == HOST_PID_NAMESPACE else None


def own_pid_namespace() -> int:
    """This process's PID namespace inode (what the lease records for each member)."""
    return os.stat("/proc/self/ns/pid").st_ino


def find_outsiders(device_processes: Sequence[GpuProcess], members: Sequence[LeaseMember],
                   nvml_pid_ns: int | None) -> OutsiderCheck:
    """Compares NVML's processes on the device with the lease's members.

    A member in NVML's namespace matches by pid; any other member is uncomparable and can only
    be counted (it may be any one of the unmatched processes). Each process counts once."""
    distinct = {(m.pid, m.pid_ns) for m in members}
    comparable = {pid for pid, pid_ns in distinct if nvml_pid_ns is not None
                  and pid_ns == nvml_pid_ns}
    unique = {p.pid: p for p in device_processes}
    unmatched = tuple(p for pid, p in sorted(unique.items()) if pid not in comparable)
    return OutsiderCheck(unmatched, len(distinct) - len(comparable))


class ComputeProcessReader(Protocol):
    """Lists the compute processes on the device with one of these UUIDs (NVML spelling,
    GPU-... or MIG-...); raises GpuProcessReadError saying why it cannot."""

    def compute_processes(self, uuid_names: Sequence[str]) -> list[GpuProcess]: ...


def warn_about_outsiders(reader: ComputeProcessReader, device: DeviceUuid | None,
                         members: Sequence[LeaseMember], group: str,
                         own_pid_ns: int | None = None) -> OutsiderCheck | None:
    """Logs one warning when processes outside the group compute on this device, naming their
    pids and memory (or, when only counting was possible, how many there are at least).
    Returns the check, or None when it could not be made (no UUID, no NVML, no permission):
    that is logged too, and never raised, since the lease works without it."""
    if device is None:
        logging.info("crossover_tf: not checking for processes outside group %r: the device "
                     "has no UUID to find it in NVML by", group)
        return None
    try:
        processes = reader.compute_processes(device.names())
    except GpuProcessReadError as err:
        logging.info("crossover_tf: not checking for processes outside group %r on %s: %s",
                     group, device.names()[0], err)
        return None
    own = own_pid_namespace() if own_pid_ns is None else own_pid_ns
    check = find_outsiders(processes, members, nvml_pid_namespace(own))
    where = device.names()[0]
    if check.complete and check.unmatched:
        logging.warning(
            "crossover_tf: %d process(es) outside group %r compute on %s: %s (host pids). They "
            "are not on the lease, so they run at the same time as the group and slow it down: "
            "a job without crossover_tf, or one using another lease directory or device key",
            len(check.unmatched), group, where,
            ", ".join(p.describe() for p in check.unmatched))
    elif check.outsider_count:
        logging.warning(
            "crossover_tf: at least %d process(es) outside group %r compute on %s: %d there "
            "(%s, host pids) match no member's pid, and only %d member(s), in PID namespaces "
            "whose pids NVML does not report, can account for them. The others run at the same "
            "time as the group: a job without crossover_tf, or one using another lease "
            "directory or device key", check.outsider_count, group, where, len(check.unmatched),
            ", ".join(p.describe() for p in check.unmatched), check.uncomparable_members)
    elif not check.complete:
        logging.info("crossover_tf: processes on %s checked only by count: %d lease member(s) "
                     "are in a PID namespace whose pids NVML does not report", where,
                     check.uncomparable_members)
    return check


_NVML_SUCCESS, _NVML_ERROR_INSUFFICIENT_SIZE = 0, 7
_NVML_VALUE_NOT_AVAILABLE = 2**64 - 1
_NVML_ERRORS = {1: "NVML not initialised", 2: "invalid argument", 3: "not supported",
                4: "no permission", 6: "not found", 9: "driver not loaded", 12: "library not "
                "found", 13: "function not found", 18: "driver/library version mismatch",
                999: "unknown error"}


class _ProcessInfoV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _ProcessInfoV2(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


# _v2 has had one layout since it appeared (R470); _v3's layout changed between driver headers
# (a confidential-computing field came and went), so it is not used. The unsuffixed entry
# point is the original, with the shortest layout.
_LISTINGS = (("nvmlDeviceGetComputeRunningProcesses_v2", _ProcessInfoV2),
             ("nvmlDeviceGetComputeRunningProcesses", _ProcessInfoV1))


class Nvml:
    """NVML through ctypes, only as far as listing a device's compute processes.
    load: how the library is opened (a fake library stands in for it in tests)."""

    def __init__(self, library: str = "libnvidia-ml.so.1",
                 load: Callable[[str], Any] = ctypes.CDLL):
        self._library = library
        self._open = load

    @staticmethod
    def _check(result: int, call: str) -> None:
        if result != _NVML_SUCCESS:
            raise GpuProcessReadError(
                f"{call} failed: {_NVML_ERRORS.get(result, f'NVML error {result}')}")

    def compute_processes(self, uuid_names: Sequence[str]) -> list[GpuProcess]:
        try:
            nvml = self._open(self._library)
            self._check(nvml.nvmlInit_v2(), "nvmlInit_v2")
            try:
                return self._list(nvml, self._handle(nvml, uuid_names))
            finally:
                nvml.nvmlShutdown()
        except (OSError, AttributeError) as err:  # no library, or one without an entry point
            raise GpuProcessReadError(f"{self._library} not usable ({err})") from err

    def _handle(self, nvml: Any, uuid_names: Sequence[str]) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        result = -1
        for name in uuid_names:
            result = nvml.nvmlDeviceGetHandleByUUID(name.encode(), ctypes.byref(handle))
            if result == _NVML_SUCCESS:
                return handle
        self._check(result, f"nvmlDeviceGetHandleByUUID({'/'.join(uuid_names)})")
        return handle

    def _list(self, nvml: Any, handle: ctypes.c_void_p) -> list[GpuProcess]:
        for entry_point, info_type in _LISTINGS:
            function = getattr(nvml, entry_point, None)
            if function is not None:
                return self._call_listing(function, entry_point, info_type, handle)
        raise GpuProcessReadError(f"{self._library} has no "
                                  "nvmlDeviceGetComputeRunningProcesses")

    def _call_listing(self, function: Any, entry_point: str, info_type: type[ctypes.Structure],
                      handle: ctypes.c_void_p) -> list[GpuProcess]:
        """NVML's two-call protocol: ask the count, then pass room for it; processes that start
        in between make it ask again, a few times at most."""
        count = ctypes.c_uint(0)
        result = function(handle, ctypes.byref(count), None)
        for _ in range(4):
            if result != _NVML_ERROR_INSUFFICIENT_SIZE:
                break
            infos = (info_type * (count.value + 4))()
            count = ctypes.c_uint(len(infos))
            result = function(handle, ctypes.byref(count), infos)
            if result == _NVML_SUCCESS:
                return [_process(info) for info in infos[:count.value]]
        else:
            raise GpuProcessReadError(f"{entry_point}: the process list kept growing")
        self._check(result, entry_point)
        return []  # success on the first call: no processes


def _process(info: Any) -> GpuProcess:
    memory = int(info.usedGpuMemory)
    return GpuProcess(int(info.pid), None if memory == _NVML_VALUE_NOT_AVAILABLE else memory)
