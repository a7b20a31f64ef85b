"""Device selection, memory policy and physical lease keys (crossover_tf.devices).

GPUs cannot be run here, so the decisions are tested on fake device descriptions, and the
placement logic on a CPU split into logical devices, with real TensorFlow and Horovod.
"""
from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import pytest

from conftest import horovodrun_command, run_bounded
from crossover_tf import devices

WORKER = str(pathlib.Path(__file__).with_name("device_worker.py"))


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


class FakeIdentity:
    """CUDA ordinals as one process numbers them -> PCI bus ids."""

    def __init__(self, bus_ids: list[str]):
        self.bus_ids = bus_ids

    def pci_bus_id(self, ordinal: int) -> str | None:
        return self.bus_ids[ordinal] if ordinal < len(self.bus_ids) else None


def test_jobs_numbering_gpus_differently_pair_on_the_physical_gpu() -> None:
    cards = ["0000:3b:00.0", "0000:5e:00.0"]
    job_a = FakeIdentity(cards)                  # CUDA_VISIBLE_DEVICES=0,1
    job_b = FakeIdentity(list(reversed(cards)))  # CUDA_VISIBLE_DEVICES=1,0
    key_a = devices.device_key(0, 0, job_a, env={})
    key_b = devices.device_key(0, 1, job_b, env={})  # B's ordinal 1 is the same card
    assert key_a == key_b == "pci-0000-3b-00-0"
    assert devices.device_key(0, 0, job_b, env={}) != key_a


def test_device_key_override_and_fallbacks() -> None:
    env = {devices.DEVICE_KEY_ENV: "host1"}
    assert devices.device_key(3, 0, FakeIdentity(["0000:3b:00.0"]), env=env) == "host1"
    with pytest.raises(ValueError, match="device key"):
        devices.device_key(0, 0, None, env={devices.DEVICE_KEY_ENV: "a/b"})
    assert devices.device_key(2, None, None, env={}) == "cpu2"
    assert devices.device_key(2, 5, FakeIdentity([]), env={}) == "gpu2"
    assert devices.device_key(2, 5, None, env={}) == "gpu2"


def test_local_device_name() -> None:
    gpu = [FakeDevice("/device:GPU:0")]
    cpus = [FakeDevice("/device:CPU:0"), FakeDevice("/device:CPU:1")]
    assert devices.local_device_name(gpu, cpus, 1) == "/device:GPU:0"
    assert devices.local_device_name([], cpus, 1) == "/device:CPU:1"
    assert devices.local_device_name([], cpus, 2) == "/device:CPU:0"
    assert devices.local_device_name([], [], 0) == "/CPU:0"


def test_cuda_driver_absent_gives_no_bus_id() -> None:
    assert devices.CudaDriver("libcuda-not-here.so.0").pci_bus_id(0) is None


@pytest.mark.multiprocess
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


def test_allreduce_placement_rejects_unknown() -> None:
    with pytest.raises(ValueError, match="allreduce_on must be one of"):
        devices.allreduce_device("nccl", True, "/device:GPU:0")


PLACEMENT_PROBE = """
import horovod.tensorflow as hvd, tensorflow as tf
from crossover_tf import collectives
hvd.init()
for device in (None, "/CPU:0"):
    fn = tf.function(lambda g: collectives.allreduce_gradients([g, None], device=device))
    graph = fn.get_concrete_function(tf.TensorSpec([3])).graph
    ops = [op.device for op in graph.get_operations() if op.type == "HorovodGroupedAllreduce"]
    print(device, ops, fn(tf.ones(3))[0].numpy().tolist())
"""


def test_allreduce_gradients_runs_where_it_is_placed(child_env: dict[str, str]) -> None:
    result = run_bounded([sys.executable, "-c", PLACEMENT_PROBE], child_env, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith(("None", "/CPU"))]
    assert lines == ["None [''] [1.0, 1.0, 1.0]", "/CPU:0 ['/device:CPU:0'] [1.0, 1.0, 1.0]"]
