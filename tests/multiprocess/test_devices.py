"""Device selection, memory policy and physical lease keys (crossover_tf._setup.devices).

GPUs cannot be run here, so the decisions are tested on fake device descriptions (the CUDA
driver's entry points over fake GPUs and MIG slices, through the real ctypes calls), and the
placement logic on a CPU split into logical devices, with real TensorFlow and Horovod.
"""
from __future__ import annotations

import ctypes
import dataclasses
import json
import pathlib
import sys
import uuid
from typing import Any

import pytest

from conftest import WORKERS, horovodrun_command, run_bounded
from crossover_tf._setup import devices
from crossover_tf.lease import segments

WORKER = str(WORKERS / "device_worker.py")


class FakeDevice:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"FakeDevice({self.name})"


class FakeConfig:
    """Records what device setup asks of tf.config; can refuse like an initialised runtime."""

    def __init__(self, gpus: int, initialised: bool = False):
        self.gpus = [FakeDevice(f"/physical_device:GPU:{i}") for i in range(gpus)]
        self.initialised = initialised
        self.calls: list[tuple[Any, ...]] = []
        self.experimental = self

    def list_physical_devices(self, device_type: str) -> list[FakeDevice]:
        return self.gpus if device_type == "GPU" else []

    def _record(self, *call: Any) -> None:
        if self.initialised:
            raise RuntimeError("Visible devices cannot be modified after being initialized")
        self.calls.append(call)

    def set_visible_devices(self, devices_: list[Any], device_type: str) -> None:
        self._record("visible", [d.name for d in devices_], device_type)

    def set_memory_growth(self, device: Any, enable: bool) -> None:
        self._record("growth", device.name, enable)

    def set_logical_device_configuration(self, device: Any, configs: list[Any]) -> None:
        self._record("logical", device.name, configs)


def test_each_local_rank_gets_its_own_gpu_with_memory_growth() -> None:
    for rank in range(4):
        config = FakeConfig(gpus=4)
        chosen = devices.configure_local_gpu(config, devices.GpuMemoryPolicy(), rank, 4)
        name = f"/physical_device:GPU:{rank}"
        assert chosen.name == name
        assert config.calls == [("visible", [name], "GPU"), ("growth", name, True)]
        assert devices.physical_gpu_ordinal(config.gpus, chosen) == rank


def test_memory_limit_sets_a_logical_device_instead_of_growth() -> None:
    config = FakeConfig(gpus=2)
    devices.configure_local_gpu(config, devices.GpuMemoryPolicy(growth=False, limit_mb=4096), 1,
                                2, logical_device_configuration=lambda **kw: kw)
    assert config.calls == [("visible", ["/physical_device:GPU:1"], "GPU"),
                            ("logical", "/physical_device:GPU:1", [{"memory_limit": 4096}])]


def test_no_gpu_configures_nothing() -> None:
    config = FakeConfig(gpus=0)
    assert devices.configure_local_gpu(config, devices.GpuMemoryPolicy(), 0, 1) is None
    assert config.calls == []


def test_initialised_runtime_is_a_clear_error() -> None:
    with pytest.raises(devices.DeviceConfigError, match="before creating any tensor"):
        devices.configure_local_gpu(FakeConfig(gpus=1, initialised=True),
                                    devices.GpuMemoryPolicy(), 0, 1)


def test_device_messages_name_the_option_that_exists(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 60: they said to pass configure_devices=False, which no constructor takes; the
    option is DeviceOptions(configure=False)."""
    with pytest.raises(devices.DeviceConfigError) as raised:
        devices.configure_local_gpu(FakeConfig(gpus=1, initialised=True),
                                    devices.GpuMemoryPolicy(), 0, 1)
    gpus = [FakeDevice("/device:GPU:0"), FakeDevice("/device:GPU:1")]
    assert devices.local_device_name(gpus, [], 0) == "/device:GPU:0"
    for text in (str(raised.value), caplog.text):
        assert "device=crossover_tf.DeviceOptions(configure=False)" in text, text
        assert "configure_devices" not in text, text


def test_more_local_ranks_than_gpus_is_an_error() -> None:
    with pytest.raises(devices.DeviceConfigError, match="at most one rank per GPU"):
        devices.select_local_gpu([FakeDevice("g0")], 1, 2)
    with pytest.raises(devices.DeviceConfigError, match="outside"):
        devices.select_local_gpu([FakeDevice("g0"), FakeDevice("g1")], 2, 2)


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "4096"])
def test_memory_policy_rejects_bad_limits(bad: Any) -> None:
    with pytest.raises(ValueError, match="memory_limit_mb"):
        devices.GpuMemoryPolicy(growth=False, limit_mb=bad)
    with pytest.raises(ValueError, match="not both"):
        devices.GpuMemoryPolicy(growth=True, limit_mb=1024)


@pytest.mark.parametrize("bus_id,key", [("0000:3B:00.0", "pci-0000-3b-00-0"),
                                        ("00000000:3b:00.0", "pci-0000-3b-00-0"),  # nvidia-smi
                                        ("0001:c1:1f.7", "pci-0001-c1-1f-7")])
def test_key_from_pci_bus_id(bus_id: str, key: str) -> None:
    assert devices.key_from_pci_bus_id(bus_id) == key


@pytest.mark.parametrize("bad", ["", "GPU-1234", "0000:3b:00", "0000:3b:00.0\nx"])
def test_key_from_bad_pci_bus_id_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="PCI bus id"):
        devices.key_from_pci_bus_id(bad)


@dataclasses.dataclass(frozen=True)
class PhysicalDevice:
    """A device as the driver knows it; a MIG slice has its GPU's bus id and its own UUID."""
    bus_id: str
    uuid: str
    parent_uuid: str | None = None  # the GPU's UUID, for a MIG slice


GPU_A = PhysicalDevice("0000:3b:00.0", "GPU-41255406-c9af-f94b-4ebf-9d57ad1853da")
GPU_B = "GPU-20bed2f5-819b-69ad-8d42-d3e1446080c1"
SLICE_1 = PhysicalDevice("0000:5e:00.0", "MIG-a65afc88-50b5-5ccf-b0a8-f93b3247ae9e", GPU_B)
SLICE_2 = PhysicalDevice("0000:5e:00.0", "MIG-90443af0-2fe6-57fb-86fe-54186d5a6581", GPU_B)


def uuid_bytes(text: str) -> bytes:
    return uuid.UUID(text[4:]).bytes


class FakeLibcuda:
    """The driver entry points CudaDriver calls, over the devices one job sees, in its
    CUDA_VISIBLE_DEVICES order; entry points can be missing or fail."""

    def __init__(self, visible: list[PhysicalDevice], missing: tuple[str, ...] = (),
                 failing: tuple[str, ...] = ()):
        self.visible = visible
        entry_points = {"cuInit": lambda flags: 0, "cuDeviceGet": self.device_get,
                        "cuDeviceGetUuid_v2": self.uuid_v2, "cuDeviceGetUuid": self.uuid_legacy,
                        "cuDeviceGetPCIBusId": self.pci_bus_id}
        for name, function in entry_points.items():
            if name not in missing:
                setattr(self, name, (lambda *args: 999) if name in failing else function)

    def device_get(self, device: Any, ordinal: int) -> int:
        if ordinal >= len(self.visible):
            return 101  # CUDA_ERROR_INVALID_DEVICE
        device._obj.value = ordinal
        return 0

    def uuid_v2(self, buf: Any, device: int) -> int:
        ctypes.memmove(buf, uuid_bytes(self.visible[device].uuid), 16)
        return 0

    def uuid_legacy(self, buf: Any, device: int) -> int:
        physical = self.visible[device]
        ctypes.memmove(buf, uuid_bytes(physical.parent_uuid or physical.uuid), 16)
        return 0

    def pci_bus_id(self, buf: Any, length: int, device: int) -> int:
        buf.value = self.visible[device].bus_id.encode()
        return 0


def driver(visible: list[PhysicalDevice], **fake: Any) -> devices.CudaDriver:
    return devices.CudaDriver(load=lambda library: FakeLibcuda(visible, **fake))


def test_two_mig_slices_of_one_gpu_get_their_own_keys() -> None:
    job = driver([SLICE_1, SLICE_2])
    keys = [devices.device_key(0, ordinal, job, env={}) for ordinal in (0, 1)]
    assert keys == ["mig-a65afc8850b55ccfb0a8f93b3247", "mig-90443af02fe657fb86fe54186d5a"]
    assert job.pci_bus_id(0) == job.pci_bus_id(1)  # what keyed them alike before


def test_a_full_gpu_keys_by_its_uuid() -> None:
    key = devices.device_key(0, 0, driver([GPU_A]), env={})
    assert key == "gpu-41255406c9aff94b4ebf9d57ad18"
    assert GPU_A.uuid.replace("-", "").lower().startswith(key.replace("-", ""))  # nvidia-smi -L
    assert driver([GPU_A]).uuid(0).names() == (GPU_A.uuid,)
    assert driver([SLICE_1]).uuid(0).names() == (SLICE_1.uuid,)


@pytest.mark.parametrize("order", [[GPU_A, SLICE_1, SLICE_2], [SLICE_2, GPU_A, SLICE_1],
                                   [SLICE_1, SLICE_2, GPU_A]])
def test_a_device_keeps_its_key_whatever_the_visible_order(order: list[PhysicalDevice]) -> None:
    job = driver(order)
    keys = {device.uuid: devices.device_key(0, ordinal, job, env={})
            for ordinal, device in enumerate(order)}
    reference = driver([GPU_A, SLICE_1, SLICE_2])
    assert keys == {device.uuid: devices.device_key(0, ordinal, reference, env={})
                    for ordinal, device in enumerate([GPU_A, SLICE_1, SLICE_2])}
    assert len(set(keys.values())) == 3


def test_jobs_numbering_gpus_differently_pair_on_the_physical_gpu_by_pci_bus_id() -> None:
    cards = [PhysicalDevice("0000:3b:00.0", GPU_A.uuid), PhysicalDevice("0000:5e:00.0", GPU_B)]
    old = ("cuDeviceGetUuid_v2",)  # a driver before CUDA 11.4
    key_a = devices.device_key(0, 0, driver(cards, missing=old), env={})
    key_b = devices.device_key(0, 1, driver(cards[::-1], missing=old), env={})
    assert key_a == key_b == "pci-0000-3b-00-0"


def test_driver_without_the_uuid_entry_point_falls_back_to_the_pci_key(
        caplog: pytest.LogCaptureFixture) -> None:
    key = devices.device_key(0, 0, driver([SLICE_1], missing=("cuDeviceGetUuid_v2",)), env={})
    assert key == "pci-0000-5e-00-0"
    assert "has no cuDeviceGetUuid_v2" in caplog.text and "MIG slices" in caplog.text


def test_uuid_errors_fall_back_with_the_reason_logged(caplog: pytest.LogCaptureFixture) -> None:
    key = devices.device_key(0, 0, driver([GPU_A], failing=("cuDeviceGetUuid_v2",)), env={})
    assert key == "pci-0000-3b-00-0"
    assert "cuDeviceGetUuid_v2 returned CUDA error 999" in caplog.text
    caplog.clear()
    everything = ("cuDeviceGetUuid_v2", "cuDeviceGetPCIBusId")
    assert devices.device_key(3, 0, driver([GPU_A], failing=everything), env={}) == "gpu3"
    assert "cuDeviceGetPCIBusId returned CUDA error 999" in caplog.text
    assert devices.device_key(3, 7, driver([GPU_A]), env={}) == "gpu3"  # no such ordinal


def test_all_zero_uuid_is_no_identity() -> None:
    blank = PhysicalDevice("0000:3b:00.0", "GPU-00000000-0000-0000-0000-000000000000")
    assert devices.device_key(0, 0, driver([blank]), env={}) == "pci-0000-3b-00-0"
    assert devices.read_device_uuid(driver([blank]), 0) is None


def test_without_the_legacy_entry_point_a_uuid_keys_but_mig_is_not_told() -> None:
    job = driver([SLICE_1, SLICE_2], missing=("cuDeviceGetUuid",))
    keys = [devices.device_key(0, ordinal, job, env={}) for ordinal in (0, 1)]
    assert keys == ["dev-a65afc8850b55ccfb0a8f93b3247", "dev-90443af02fe657fb86fe54186d5a"]
    assert job.uuid(0).names() == ("GPU-" + SLICE_1.uuid[4:], SLICE_1.uuid)


def test_uuid_keys_fit_the_lease_key_rule() -> None:
    for mig in (True, False, None):
        key = devices.key_from_uuid(devices.DeviceUuid(b"\xff" * 16, mig))
        assert len(key) == segments.DEVICE_KEY_MAX_LEN
        assert segments.validate_name("device key", key, segments.DEVICE_KEY_MAX_LEN) == key
    with pytest.raises(ValueError, match="not a device UUID"):
        devices.DeviceUuid(b"\x01" * 15, False)


def test_device_key_override_and_fallbacks() -> None:
    env = {devices.DEVICE_KEY_ENV: "host1"}
    assert devices.device_key(3, 0, driver([SLICE_1]), env=env) == "host1"
    with pytest.raises(ValueError, match="device key"):
        devices.device_key(0, 0, None, env={devices.DEVICE_KEY_ENV: "a/b"})
    assert devices.device_key(2, None, None, env={}) == "cpu2"
    assert devices.device_key(2, 5, None, env={}) == "gpu2"


def test_local_device_name() -> None:
    gpu = [FakeDevice("/device:GPU:0")]
    cpus = [FakeDevice("/device:CPU:0"), FakeDevice("/device:CPU:1")]
    assert devices.local_device_name(gpu, cpus, 1) == "/device:GPU:0"
    assert devices.local_device_name([], cpus, 1) == "/device:CPU:1"
    assert devices.local_device_name([], cpus, 2) == "/device:CPU:0"
    assert devices.local_device_name([], [], 0) == "/CPU:0"


def test_cuda_driver_absent_is_a_reason_not_a_crash() -> None:
    absent = devices.CudaDriver("libcuda-not-here.so.0")
    with pytest.raises(devices.GpuIdentityError, match="not loadable"):
        absent.pci_bus_id(0)
    assert devices.read_device_uuid(absent, 0) is None
    assert devices.device_key(1, 0, absent, env={}) == "gpu1"


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_ranks_place_their_ops_on_their_own_logical_device(tmp_path: pathlib.Path,
                                                               child_env: dict[str, str]) -> None:
    child_env.pop(devices.DEVICE_KEY_ENV, None)
    result = run_bounded(horovodrun_command(2, sys.executable, WORKER,
                                            str(tmp_path / "rank_RANK.json"), "2"),
                         child_env, timeout=180)
    assert result.returncode == 0, result.stdout[-4000:]
    for rank in range(2):
        report = json.loads((tmp_path / f"rank_{rank}.json").read_text())
        expected = f"/job:localhost/replica:0/task:0/device:CPU:{report['local_rank']}"
        assert report["variable_devices"] == [expected], report
        assert report["op_device"] == expected, report
        assert report["device_key"] == f"cpu{report['local_rank']}", report


def test_gpu_check_script_skips_clearly_without_a_gpu() -> None:
    from conftest import REPO_ROOT, gpu_visible
    if gpu_visible():
        pytest.skip("a GPU is visible: scripts/gpu_check.sh would run for real")
    script = str(REPO_ROOT / "scripts" / "gpu_check.sh")
    result = run_bounded(["bash", script], {"PATH": "/usr/bin:/bin"}, timeout=60)
    assert result.returncode == 0, result.stdout
    assert "gpu_check: SKIPPED - no NVIDIA GPU is visible" in result.stdout, result.stdout


@pytest.mark.multiprocess
@pytest.mark.slow
def test_gpu_pair_experiment_runs_and_reports_every_scenario(tmp_path: pathlib.Path,
                                                             child_env: dict[str, str]) -> None:
    """What gpu_check.sh runs on a GPU, run here on the CPU as the shared device."""
    child_env.pop(devices.DEVICE_KEY_ENV, None)
    result = run_bounded([sys.executable, "-m", "experiments.gpu_pair", "--model=small_cnn",
                          "--dataset=synthetic:mnist", "--global_batch_size=32", "--steps=120",
                          "--warmup_steps=5", f"--model_dir={tmp_path}", "--timeout_s=300"],
                         child_env, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:]
    summary = json.loads((tmp_path / "gpu_pair.json").read_text())
    assert [(r["scenario"], r["job"]) for r in summary["rows"]] == [
        ("solo", "A"), ("naive", "A"), ("naive", "B"), ("crossover", "A"), ("crossover", "B")]
    assert all(r["images_per_s"] > 0 and r["peak_device_memory_mb"] is None
               for r in summary["rows"])
    assert set(summary["ratios"]) == {"crossover_over_naive", "crossover_over_solo",
                                      "naive_over_solo"}
    assert "| crossover | B |" in (tmp_path / "gpu_pair.md").read_text()


@pytest.mark.parametrize("placement,crossing,device,expected", [
    ("auto", True, "/job:localhost/replica:0/task:0/device:GPU:0", "/CPU:0"),
    ("auto", False, "/job:localhost/replica:0/task:0/device:GPU:0", None),
    ("auto", True, "/device:CPU:1", None),
    ("host", False, "/device:GPU:0", "/CPU:0"),
    ("device", True, "/device:GPU:0", None),
])
def test_allreduce_placement(placement: str, crossing: bool, device: str,
                             expected: str | None) -> None:
    assert devices.allreduce_device(placement, crossing, device) == expected


PLACEMENT_PROBE = """
import horovod.tensorflow as hvd, tensorflow as tf
from crossover_tf._communication.horovod import HorovodCommunicator
comm = HorovodCommunicator()
def collectives(fn):
    graph = fn.get_concrete_function(tf.TensorSpec([3])).graph
    return [op.device for op in graph.get_operations() if op.type == "HorovodGroupedAllreduce"]
for device in (None, "/CPU:0"):
    fn = tf.function(lambda g: comm.allreduce([g], mean=True, name="g", device=device,
                                              compress=True))
    print(device, collectives(fn), fn(tf.ones(3))[0].numpy().tolist())
one_rank = tf.function(lambda g: comm.allreduce_gradients([g, None], device="/CPU:0"))
print("one rank", collectives(one_rank), one_rank(tf.ones(3))[0].numpy().tolist())
"""


@pytest.mark.slow
def test_allreduce_gradients_runs_where_it_is_placed(child_env: dict[str, str]) -> None:
    """The gradients' allreduce runs on the device it is placed on; a job of one rank runs no
    collective for its gradients at all (the mean of one is itself)."""
    result = run_bounded([sys.executable, "-c", PLACEMENT_PROBE], child_env, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    lines = [line for line in result.stdout.splitlines()
             if line.startswith(("None", "/CPU", "one rank"))]
    assert lines == ["None [''] [1.0, 1.0, 1.0]", "/CPU:0 ['/device:CPU:0'] [1.0, 1.0, 1.0]",
                     "one rank [] [1.0, 1.0, 1.0]"]
