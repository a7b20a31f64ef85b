"""Shared pytest fixtures: quiet TensorFlow logs, repo root on sys.path, unique lease groups.

The tests are in folders by tier, each file in the tier of the heaviest thing it needs
(tests/README.md): unit/ (one process), multiprocess/ (horovodrun or lease contenders on
localhost), system/ (root, network namespaces, Slurm, Prometheus, wheel builds, the documented
commands), gpu/ (an NVIDIA GPU for its real checks). support/ holds their shared helpers (on
sys.path here), workers/ the scripts the multi-process tests launch, data/ saved records.
"""
from __future__ import annotations

import functools
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import uuid

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
TESTS = pathlib.Path(__file__).resolve().parent
REPO_ROOT = TESTS.parent
WORKERS = TESTS / "workers"
DATA = TESTS / "data"
for _path in (REPO_ROOT, TESTS / "support"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

# Fixtures shared by several test modules (tests/support/compare_fakes.py: the comparison's
# fake cluster and jobs).
pytest_plugins = ["compare_fakes"]


@functools.lru_cache(maxsize=None)
def gpu_visible() -> bool:
    """An NVIDIA GPU this machine can use (asked of nvidia-smi, so TensorFlow stays unloaded)."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listing.returncode == 0 and "GPU" in listing.stdout


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if gpu_visible():
        return
    skip = pytest.mark.skip(reason="needs_gpu: no NVIDIA GPU visible (nvidia-smi -L)")
    for item in items:
        if "needs_gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def lease_group() -> str:
    """A lease group no other test (or concurrent test run) uses; its segments are removed after."""
    group = f"t{uuid.uuid4().hex[:12]}"
    yield group
    from crossover_tf.lease.segments import remove_group_segments
    remove_group_segments([group])


@pytest.fixture(scope="session")
def lease_cli() -> pathlib.Path:
    """The lease core's CLI (ops/testing/lease_cli.cc), rebuilt if its sources are newer."""
    subprocess.run(["make", "-s", "-C", str(REPO_ROOT / "ops"), "tests"], check=True,
                   timeout=300)
    return REPO_ROOT / "ops" / "build" / "lease_cli"


@pytest.fixture
def child_env() -> dict[str, str]:
    """Environment for child Python processes: repo importable, TF quiet."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def horovodrun_command(num_proc: int, *command: str) -> list[str]:
    """`horovodrun --gloo` on localhost, from this interpreter's environment."""
    horovodrun = pathlib.Path(sys.executable).with_name("horovodrun")
    return [str(horovodrun), "--gloo", "-np", str(num_proc), "-H", f"localhost:{num_proc}",
            *command]


BACKENDS = ("horovod", "tensorflow")  # CommunicationOptions.backend; tests cross under both


# A glog error line of a rank behind the launcher's prefix ("[1]: E0000 00:00:..."): a run that
# succeeded prints none (issue 51).
ERROR_LINE = re.compile(r"^\[\d+\]: E\d{4} ", re.MULTILINE)


def launch_command(backend: str, num_proc: int, *command: str) -> list[str]:
    """num_proc local ranks of command, started as the backend's jobs are: horovodrun for
    Horovod, `python -m crossover_tf.launch` (each task's TF_CONFIG) for TensorFlow's."""
    if backend == "horovod":
        return horovodrun_command(num_proc, *command)
    return [sys.executable, "-m", "crossover_tf.launch", "-np", str(num_proc), "--", *command]


def run_bounded(cmd: list[str], env: dict[str, str], timeout: float,
                cwd: str | None = None) -> subprocess.CompletedProcess:
    """Runs cmd in its own process group; on timeout kills the whole group and fails."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"timed out after {timeout} s: {' '.join(cmd)}\n{out[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, None)


def run_alongside(first: list[str], second: list[str], env: dict[str, str], timeout: float
                  ) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """Runs two commands at the same time (e.g. two crossed jobs); each bounded by timeout,
    the first killed if the second fails to finish."""
    proc = subprocess.Popen(first, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        second_result = run_bounded(second, env, timeout)
        out, _ = proc.communicate(timeout=timeout)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(first, proc.returncode, out, None), second_result


def run_worker_pair(worker: str, out_dir: pathlib.Path, backend: str, args: list[str],
                    env: dict[str, str], *, a: tuple[str, ...] = (), b: tuple[str, ...] = (),
                    timeout: float = 240) -> None:
    """Jobs a and b of `worker`, 2 ranks each, side by side (each writing <job>_RANK.json in
    out_dir; `a`, `b`: each job's own arguments); fails with the output of either that did."""
    for result in run_alongside(
            launch_command(backend, 2, sys.executable, worker, str(out_dir / "a_RANK.json"),
                           *a, *args),
            launch_command(backend, 2, sys.executable, worker, str(out_dir / "b_RANK.json"),
                           *b, *args), env, timeout=timeout):
        assert result.returncode == 0, result.stdout[-6000:]
