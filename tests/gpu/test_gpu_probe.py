"""ops/gpu_probe without a GPU: its host logic (phase timing, modes, the lease, JSON) through the
CPU stand-in build (make -C ops gpu_probe_cpu), the JSON-to-parameters path of the planner on a
recorded stand-in run (tests/data/gpu_probe_cpu_standin.json: CPU numbers, never GPU ones), and
scripts/gpu_probe.sh skipping where there is no nvcc or GPU."""
from __future__ import annotations

import json
import os
import statistics
import subprocess

import pytest

from conftest import REPO_ROOT, gpu_visible
from crossover_tf_planner import gpu_calibration
from crossover_tf_planner.device_models import DeviceModel

PROBE = REPO_ROOT / "ops" / "build" / "gpu_probe_cpu"
EXAMPLE = REPO_ROOT / "tests" / "data" / "gpu_probe_cpu_standin.json"
COMPUTE_MS, COMM_RATIO = 5.0, 1.0


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One short stand-in run: 2 processes, C = M = 5 ms, both communication kinds, 2 trials."""
    subprocess.run(["make", "-s", "-C", str(REPO_ROOT / "ops"), "gpu_probe_cpu"], check=True,
                   timeout=300)
    out = tmp_path_factory.mktemp("gpu_probe") / "probe.json"
    proc = subprocess.run(
        [str(PROBE), f"--compute_ms={COMPUTE_MS}", f"--ratios={COMM_RATIO}",
         "--comm=host,device", "--modes=solo,naive,crossover,mps", "--trials=2",
         "--window_ms=300", "--warmup_ms=100", f"--out={out}"],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| M/C | comm |" in proc.stdout  # the markdown table
    return json.loads(out.read_text())


def _aggregate(session: dict) -> float:
    return sum(session["steps_per_s"])


@pytest.mark.slow
def test_json_structure(probe: dict) -> None:
    assert probe["probe"] == "gpu_probe" and probe["schema"] == 1
    assert probe["stand_in"] is True and "NOT GPU numbers" in probe["note"]
    assert probe["settings"]["procs"] == 2 and probe["calibration"]["units"] > 0
    assert probe["mps"] == {"available": False, "reason": "CPU stand-in: there is no MPS"}
    assert [(p["ratio"], p["comm"]) for p in probe["points"]] == [(1, "host"), (1, "device")]
    for point in probe["points"]:
        assert point["comm_ms"] == pytest.approx(COMPUTE_MS * COMM_RATIO)
        modes = sorted((s["trial"], s["mode"]) for s in point["sessions"])
        assert modes == [(t, m) for t in (0, 1) for m in ("crossover", "naive", "solo")]
        for session in point["sessions"]:
            assert session["ok"], session["error"]
            assert len(session["steps_per_s"]) == (1 if session["mode"] == "solo" else 2)
            assert all(sps > 0 for sps in session["steps_per_s"])
            assert 0 < session["busy_fraction"] <= 1
        assert set(point["busy_fraction"]) == {"solo", "naive", "crossover", "mps"}
        assert point["ratios"]["mps_vs_solo"] is None  # mps did not run


@pytest.mark.slow
def test_phase_timing(probe: dict) -> None:
    """A step is one compute and one communication phase: it cannot be shorter than M, and the
    stand-in's compute phase is the calibrated one. The bounds on times are loose on purpose:
    the stand-in computes on CPU cores that other work shares, so they only catch unit and
    sizing mistakes, not noise."""
    assert 0.2 * COMPUTE_MS <= probe["calibration"]["compute_ms"] <= 5 * COMPUTE_MS
    for point in probe["points"]:
        for session in point["sessions"]:
            for sps in session["steps_per_s"]:
                assert sps <= 1e3 / point["comm_ms"]
            if session["mode"] == "solo":
                assert session["compute_ms"][0] >= 0.3 * probe["calibration"]["compute_ms"]


@pytest.mark.slow
def test_crossover_holds_never_overlap(probe: dict) -> None:
    for point in probe["points"]:
        assert point["crossover_overlaps"] == 0
        for session in point["sessions"]:
            if session["mode"] != "crossover":
                assert session["holds"] == []
                continue
            holds = sorted(session["holds"], key=lambda h: h[2])
            assert {h[0] for h in holds} == {0, 1}, "both processes held the lease"
            for prev, nxt in zip(holds, holds[1:]):
                assert nxt[2] >= prev[3], f"holds overlap: {prev} and {nxt}"
            assert all(h[1] <= h[2] <= h[3] for h in holds)  # requested <= acquired <= released
            assert session["overlaps"] == 0
        assert point["handoff_us"]["n"] > 0 and point["handoff_us"]["min"] >= 0


@pytest.mark.slow
def test_ratios_are_median_min_max_over_trials(probe: dict) -> None:
    for point in probe["points"]:
        by = {(s["trial"], s["mode"]): s for s in point["sessions"]}
        for name, num, den in (("naive_vs_solo", "naive", "solo"),
                               ("crossover_vs_solo", "crossover", "solo"),
                               ("crossover_vs_naive", "crossover", "naive")):
            values = [_aggregate(by[t, num]) / _aggregate(by[t, den]) for t in (0, 1)]
            summary = point["ratios"][name]
            assert summary["values"] == pytest.approx(values, rel=1e-4)
            assert summary["median"] == pytest.approx(statistics.median(values), rel=1e-4)
            assert (summary["min"], summary["max"]) == pytest.approx((min(values), max(values)),
                                                                      rel=1e-4)
            assert summary["n"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("arg", ["--procs=9", "--modes=solo,bogus", "--comm=nic", "--x=1"])
def test_bad_arguments_are_refused(probe: dict, arg: str) -> None:
    proc = subprocess.run([str(PROBE), arg], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "gpu_probe:" in proc.stderr


def test_script_skips_without_nvcc() -> None:
    env = {**os.environ, "NVCC": "/nonexistent/nvcc"}
    proc = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "gpu_probe.sh")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "gpu_probe: SKIPPED - no nvcc" in proc.stdout


@pytest.mark.skipif(gpu_visible(), reason="a GPU is visible: the script would measure it")
def test_script_skips_without_gpu() -> None:
    env = {**os.environ, "NVCC": "true"}  # an nvcc stand-in: only the GPU check is left
    proc = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "gpu_probe.sh")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "gpu_probe: SKIPPED - no NVIDIA GPU" in proc.stdout


def test_fit_recovers_the_efficiency_it_predicts() -> None:
    compute_s, comm_s = 0.02, 0.02
    ratio = gpu_calibration.predicted_naive_ratio(compute_s, comm_s, 0.7)
    assert gpu_calibration.predicted_naive_ratio(compute_s, comm_s, 1.0) > ratio
    assert gpu_calibration.fit_efficiency(compute_s, comm_s, ratio) == pytest.approx(0.7,
                                                                                    abs=0.01)
    assert gpu_calibration.fit_efficiency(compute_s, comm_s, 5.0) == 1.0  # clipped


def test_gpu_params_from_recorded_stand_in_run(tmp_path) -> None:
    params = gpu_calibration.gpu_params(gpu_calibration.load_probe(EXAMPLE))
    assert params["stand_in"] is True and "NOT GPU numbers" in params["source"]
    assert 0 < params["device_efficiency"] <= 1 and params["handoff_s"] > 0
    fitted = [p for p in params["points"] if p["device_efficiency"] is not None]
    assert {p["comm"] for p in fitted} == {"host"} and len(fitted) == 3
    assert params["device_efficiency"] == pytest.approx(
        statistics.median(p["device_efficiency"] for p in fitted))
    model = gpu_calibration.gpu_model(params)
    assert isinstance(model, DeviceModel) and model.name == "gpu"
    assert model.device_efficiency == params["device_efficiency"]

    assert gpu_calibration.main([str(EXAMPLE), "--out_dir", str(tmp_path)]) == 0
    written = json.loads((tmp_path / "gpu_params.json").read_text())
    assert written["device_efficiency"] == pytest.approx(params["device_efficiency"])
    assert "device_efficiency =" in (tmp_path / "gpu_params.md").read_text()


def test_gpu_params_refuses_what_it_cannot_model(tmp_path) -> None:
    probe = json.loads(EXAMPLE.read_text())
    probe["settings"]["procs"] = 3
    with pytest.raises(ValueError, match="two jobs"):
        gpu_calibration.gpu_params(probe)
    not_probe = tmp_path / "other.json"
    not_probe.write_text(json.dumps({"probe": "something else"}))
    assert gpu_calibration.main([str(not_probe)]) == 2
