"""Processes outside the crossover group on its GPU (crossover_tf._setup.gpu_processes).

No GPU here: the comparison is a pure function of process lists, tested with fake members and
NVML listings; the NVML reader runs its real ctypes calls against a fake libnvidia-ml.
"""
from __future__ import annotations

import ctypes
import dataclasses
import logging
from typing import Any

import pytest

from crossover_tf._setup import gpu_processes as gp
from crossover_tf._setup.devices import DeviceUuid

HOST = gp.HOST_PID_NAMESPACE
CONTAINER = 4026532500  # some other PID namespace's inode
MIG = DeviceUuid(bytes.fromhex("a65afc8850b55ccfb0a8f93b3247ae9e"), True)
MIG_NAME = "MIG-a65afc88-50b5-5ccf-b0a8-f93b3247ae9e"


@dataclasses.dataclass(frozen=True)
class Member:
    pid: int
    pid_ns: int


def processes(*pids: int) -> list[gp.GpuProcess]:
    return [gp.GpuProcess(pid, pid * 2**20) for pid in pids]


def test_members_in_the_host_namespace_are_matched_by_pid() -> None:
    check = gp.find_outsiders(processes(100, 200), [Member(100, HOST), Member(200, HOST)], HOST)
    assert check.complete and check.outsiders == () and check.outsider_count == 0


def test_a_process_outside_the_group_is_named() -> None:
    check = gp.find_outsiders(processes(100, 200, 300, 300),
                              [Member(100, HOST), Member(200, HOST)], HOST)
    assert check.outsiders == (gp.GpuProcess(300, 300 * 2**20),)
    assert check.outsider_count == 1


def test_members_in_another_namespace_are_only_counted() -> None:
    # Two containers: their pids (1 in each) are not NVML's, so no pid may be compared.
    members = [Member(1, CONTAINER), Member(1, CONTAINER + 1)]
    two = gp.find_outsiders(processes(5001, 5002), members, HOST)
    assert not two.complete and two.outsider_count == 0 and two.outsiders == ()
    three = gp.find_outsiders(processes(5001, 5002, 5003), members, HOST)
    assert three.outsider_count == 1 and three.outsiders == ()
    assert len(three.unmatched) == 3


def test_a_pid_from_another_namespace_never_matches_by_accident() -> None:
    # Member pid 300 lives in a container; host pid 300 on the GPU may be anyone.
    check = gp.find_outsiders(processes(300), [Member(300, CONTAINER)], HOST)
    assert check.unmatched == tuple(processes(300)) and check.outsider_count == 0


def test_outside_the_host_namespace_nothing_is_compared_by_pid() -> None:
    assert gp.nvml_pid_namespace(HOST) == HOST
    assert gp.nvml_pid_namespace(CONTAINER) is None
    check = gp.find_outsiders(processes(100, 200), [Member(100, CONTAINER)], None)
    assert check.uncomparable_members == 1 and check.outsider_count == 1


class FakeReader:
    def __init__(self, listing: list[gp.GpuProcess] | None = None, error: str = ""):
        self.listing, self.error, self.asked = listing or [], error, []

    def compute_processes(self, uuid_names: Any) -> list[gp.GpuProcess]:
        self.asked.append(tuple(uuid_names))
        if self.error:
            raise gp.GpuProcessReadError(self.error)
        return self.listing


def test_warning_names_the_outsiders_and_their_memory(caplog: pytest.LogCaptureFixture) -> None:
    reader = FakeReader([gp.GpuProcess(100, 2**30), gp.GpuProcess(777, None)])
    check = gp.warn_about_outsiders(reader, MIG, [Member(100, HOST)], "g1", own_pid_ns=HOST)
    assert check is not None and [p.pid for p in check.outsiders] == [777]
    assert reader.asked == [(MIG_NAME,)]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "1 process(es) outside group 'g1'" in warnings[0]
    assert "pid 777 (memory unknown)" in warnings[0] and MIG_NAME in warnings[0]


def test_counted_outsiders_are_warned_about_without_names(
        caplog: pytest.LogCaptureFixture) -> None:
    reader = FakeReader(processes(5001, 5002, 5003))
    check = gp.warn_about_outsiders(reader, MIG, [Member(1, CONTAINER), Member(2, CONTAINER)],
                                    "g1", own_pid_ns=CONTAINER)
    assert check is not None and check.outsider_count == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "at least 1 process(es) outside group 'g1'" in warnings[0]


def test_no_warning_when_all_are_members_or_it_cannot_be_told(
        caplog: pytest.LogCaptureFixture) -> None:
    gp.warn_about_outsiders(FakeReader(processes(100)), MIG, [Member(100, HOST)], "g",
                            own_pid_ns=HOST)
    gp.warn_about_outsiders(FakeReader(processes(5001)), MIG, [Member(1, CONTAINER)], "g",
                            own_pid_ns=CONTAINER)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_reader_failure_or_no_uuid_is_unknown_not_an_error(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    failing = FakeReader(error="nvmlInit_v2 failed: no permission")
    assert gp.warn_about_outsiders(failing, MIG, [], "g", own_pid_ns=HOST) is None
    assert "no permission" in caplog.text
    assert gp.warn_about_outsiders(FakeReader(), None, [], "g", own_pid_ns=HOST) is None
    assert gp.warn_about_outsiders(gp.Nvml("libnvidia-ml-not-here.so.1"), MIG, [], "g") is None


def test_own_pid_namespace_is_the_proc_inode() -> None:
    assert gp.own_pid_namespace() > 0


class FakeLibnvml:
    """The NVML entry points the reader calls, over one device's process table; the table can
    grow between the count and the read, entry points can be missing or refuse."""

    def __init__(self, uuid: str, table: list[tuple[int, int]], grow_once: int = 0,
                 missing: tuple[str, ...] = (), refuse: dict[str, int] | None = None):
        self.uuid, self.table, self.grow_once = uuid, table, grow_once
        self.shutdowns = 0
        self.layouts: list[int] = []
        refuse = refuse or {}
        entry_points = {"nvmlInit_v2": lambda: 0, "nvmlShutdown": self.shutdown,
                        "nvmlDeviceGetHandleByUUID": self.handle,
                        "nvmlDeviceGetComputeRunningProcesses_v2": self.listing,
                        "nvmlDeviceGetComputeRunningProcesses": self.listing}
        for name, function in entry_points.items():
            if name not in missing:
                setattr(self, name, (lambda *a, code=refuse[name]: code) if name in refuse
                        else function)

    def shutdown(self) -> int:
        self.shutdowns += 1
        return 0

    def handle(self, name: bytes, handle: Any) -> int:
        if name.decode() != self.uuid:
            return 6  # NVML_ERROR_NOT_FOUND
        handle._obj.value = 0x7F00DEAD0000  # a 64-bit pointer must pass through whole
        return 0

    def listing(self, handle: Any, count: Any, infos: Any) -> int:
        assert handle.value == 0x7F00DEAD0000
        if self.grow_once:
            self.table = self.table + [(9000 + i, 1) for i in range(self.grow_once)]
            self.grow_once = 0
            if infos is not None:
                count._obj.value = len(self.table)
                return 7
        if infos is None or count._obj.value < len(self.table):
            count._obj.value = len(self.table)
            return 7 if self.table else 0
        self.layouts.append(ctypes.sizeof(infos) // len(infos))
        for info, (pid, memory) in zip(infos, self.table):
            info.pid, info.usedGpuMemory = pid, memory
        count._obj.value = len(self.table)
        return 0


def nvml(fake: FakeLibnvml) -> gp.Nvml:
    return gp.Nvml(load=lambda library: fake)


def test_nvml_reader_lists_the_device_found_by_uuid() -> None:
    fake = FakeLibnvml(MIG_NAME, [(100, 2**30), (200, 2**64 - 1)])
    listing = nvml(fake).compute_processes(("GPU-" + MIG_NAME[4:], MIG_NAME))
    assert listing == [gp.GpuProcess(100, 2**30), gp.GpuProcess(200, None)]
    assert fake.layouts == [24] and fake.shutdowns == 1  # the _v2 layout


def test_nvml_reader_handles_an_empty_device_and_a_growing_table() -> None:
    assert nvml(FakeLibnvml(MIG_NAME, [])).compute_processes([MIG_NAME]) == []
    grown = nvml(FakeLibnvml(MIG_NAME, [(100, 1)], grow_once=6)).compute_processes([MIG_NAME])
    assert [p.pid for p in grown] == [100] + [9000 + i for i in range(6)]


def test_nvml_reader_uses_the_original_layout_without_v2() -> None:
    fake = FakeLibnvml(MIG_NAME, [(100, 5)],
                       missing=("nvmlDeviceGetComputeRunningProcesses_v2",))
    assert nvml(fake).compute_processes([MIG_NAME]) == [gp.GpuProcess(100, 5)]
    assert fake.layouts == [16]


@pytest.mark.parametrize("fake,reason", [
    (FakeLibnvml("GPU-other", []), "not found"),
    (FakeLibnvml(MIG_NAME, [], refuse={"nvmlInit_v2": 4}), "no permission"),
    (FakeLibnvml(MIG_NAME, [(1, 1)],
                 refuse={"nvmlDeviceGetComputeRunningProcesses_v2": 4}), "no permission"),
    (FakeLibnvml(MIG_NAME, [], missing=("nvmlDeviceGetHandleByUUID",)), "not usable"),
])
def test_nvml_reader_failures_say_why(fake: FakeLibnvml, reason: str) -> None:
    with pytest.raises(gp.GpuProcessReadError, match=reason):
        nvml(fake).compute_processes([MIG_NAME])
