"""The pip paths end to end, each in a fresh virtual environment, from a directory outside the
repository:
- the README's own install words (tests the block named `install` in README.md) with the
  current pip, build isolation on, beside a stock tensorflow-cpu: the op compiles on first use
  into the cache, and two jobs cross with no backend option;
- a wheel built against this TensorFlow (`pip wheel --no-build-isolation`) carries the op
  library, and an environment with only that wheel (and Horovod) trains a crossed pair.

Slow (each route compiles the op once, about a minute, and each environment installs
TensorFlow): one wheel and one environment per route serve the whole session.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import shutil
import signal
import time
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO_ROOT, WORKERS
from crossover_tf.lease import op_cache
from test_doc_snippets import extract_blocks

USER_SCRIPT = WORKERS / "wheel_user_train.py"
BUILD_TIMEOUT_S = 900       # compiling the op takes ~1 min on 2 idle cores
INSTALL_TIMEOUT_S = 1200    # TensorFlow and the other dependencies into an empty environment
PAIR_TIMEOUT_S = 300
STEPS = 30
NAMESPACED = ("crossover_tf/", "crossover_tf_planner/", "crossover_tf-")


def run_checked(cmd: list[str], timeout: float, **kwargs) -> str:
    """Runs cmd to completion within timeout; fails the test with its output otherwise."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"timed out after {timeout} s: {' '.join(cmd)}\n{err.stdout}\n{err.stderr}")
    if done.returncode != 0:
        pytest.fail(f"failed ({done.returncode}): {' '.join(cmd)}\n"
                    f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done.stdout


def copy_checkout(dst: pathlib.Path) -> None:
    """What a fresh clone would hold (tracked and new unignored files): no build outputs."""
    listing = run_checked(["git", "ls-files", "-co", "--exclude-standard", "-z"], 60,
                          cwd=REPO_ROOT)
    for name in filter(None, listing.split("\0")):
        source = REPO_ROOT / name
        if source.is_file():       # a tracked file someone has just deleted is skipped
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dst / name)


def pin(name: str) -> str:
    """The project's pinned requirement for name (scripts/pins.py reads pyproject.toml)."""
    return run_checked([sys.executable, str(REPO_ROOT / "scripts" / "pins.py"), name],
                       60).strip()


def tensorflow_distribution() -> str:
    """tensorflow-cpu or tensorflow: whichever this environment runs (install.sh's choice)."""
    for name in ("tensorflow-cpu", "tensorflow"):
        try:
            importlib.metadata.version(name)
            return name
        except importlib.metadata.PackageNotFoundError:
            continue
    pytest.fail("neither tensorflow-cpu nor tensorflow is installed here")


def horovod_wheel_dir(tf_name: str) -> pathlib.Path:
    """scripts/install.sh's cache of the Horovod wheel built against this TensorFlow."""
    cache = op_cache.cache_root().parent  # the project's cache folder, the op's beside it
    hvd = pin("horovod").split("==")[1]
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    name = f"horovod-{hvd}-{tf_name}-{importlib.metadata.version(tf_name)}-{tag}"
    path = pathlib.Path(cache, "wheels", name)
    if not list(path.glob("horovod-*.whl")):
        pytest.skip(f"no cached Horovod wheel in {path} (scripts/install.sh builds it there)")
    return path


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory) -> pathlib.Path:
    """`pip wheel` of a copy of the checkout, against this environment's TensorFlow."""
    root = tmp_path_factory.mktemp("wheel")
    copy_checkout(root / "src")
    run_checked([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
                 str(root / "src"), "-w", str(root / "dist")], BUILD_TIMEOUT_S)
    (wheel,) = (root / "dist").glob("crossover_tf-*.whl")
    return wheel


def new_venv(tmp_path_factory, wheel_requirement: str, *pip_args: str) -> pathlib.Path:
    """A new, empty virtual environment (no system site-packages) with only the wheel, its
    dependencies and the pinned TensorFlow installed."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    run_checked([sys.executable, "-m", "venv", str(venv)], 300)
    run_checked([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                 "--disable-pip-version-check", *pip_args, wheel_requirement,
                 pin(tensorflow_distribution())], INSTALL_TIMEOUT_S)
    return venv


@pytest.fixture(scope="session")
def fresh_venv(tmp_path_factory, built_wheel) -> pathlib.Path:
    """The wheel with its horovod extra, from the cached Horovod wheel."""
    return new_venv(tmp_path_factory, f"{built_wheel}[horovod]", "--find-links",
                    str(horovod_wheel_dir(tensorflow_distribution())))


def user_env(venv: pathlib.Path, cache: pathlib.Path | None = None) -> dict[str, str]:
    """A user's shell with the fresh environment activated: nothing points into the repo (and
    the op cache, where given, is the test's own)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "CROSSOVER_LEASE_OPS", "VIRTUAL_ENV", "PYTHONHOME",
                        "PIP_NO_BUILD_ISOLATION", "CROSSOVER_CACHE")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               PYTHONNOUSERSITE="1", TF_CPP_MIN_LOG_LEVEL="2", PIP_DISABLE_PIP_VERSION_CHECK="1")
    if cache is not None:
        env["CROSSOVER_CACHE"] = str(cache)
    return env


def readme_install_block() -> str:
    """README.md's block named `install`: the words a user types."""
    blocks, _ = extract_blocks(REPO_ROOT / "README.md")
    (block,) = [b for b in blocks if b.marker and b.marker.name == "install"]
    return block.code


@pytest.fixture(scope="session")
def readme_venv(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path, dict[str, float]]:
    """A stock TensorFlow user who never built Horovod: a new venv, the current pip, the pinned
    tensorflow-cpu, then README.md's install block run as written from the folder holding a
    clone (a copy of the checkout) named crossover_tf. Returns the venv, its op cache and the
    install's seconds."""
    root = tmp_path_factory.mktemp("readme")
    venv, cache, home = root / "env", root / "cache", root / "home"
    copy_checkout(home / "crossover_tf")
    python = str(venv / "bin" / "python")
    run_checked([sys.executable, "-m", "venv", str(venv)], 300)
    run_checked([python, "-m", "pip", "install", "-q", "-U", "pip"], INSTALL_TIMEOUT_S)
    run_checked([python, "-m", "pip", "install", "-q", pin(tensorflow_distribution())],
                INSTALL_TIMEOUT_S)
    start = time.monotonic()
    run_checked(["bash", "-e", "-o", "pipefail", "-c", readme_install_block()], INSTALL_TIMEOUT_S,
                env=user_env(venv, cache), cwd=home)
    return venv, cache, {"install_s": time.monotonic() - start}


def run_pair(commands: list[list[str]], env: dict[str, str], cwd: pathlib.Path,
             timeout: float) -> list[tuple[int, str]]:
    """Runs the commands at the same time, each in its own process group; all are killed
    if any outlives timeout."""
    procs = [subprocess.Popen(c, env=env, cwd=cwd, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for c in commands]
    results = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            results.append((proc.returncode, out))
    except subprocess.TimeoutExpired:
        pytest.fail(f"crossed pair timed out after {timeout} s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    return results


@pytest.mark.slow
def test_wheel_carries_the_op_and_only_namespaced_packages(built_wheel):
    assert "-cp311-cp311-linux_" in built_wheel.name, built_wheel.name  # platform-specific
    with zipfile.ZipFile(built_wheel) as wheel:
        names = wheel.namelist()
        assert "crossover_tf/lease/_lease_ops.so" in names
        assert "crossover_tf/lease/_lease_observer.so" in names  # the exporter's reader
        assert "crossover_tf/lease/_bind_address.so" in names  # crossover_tf.launch's guard
        record = json.loads(wheel.read("crossover_tf/lease/_lease_ops.build.json"))
    assert record == {"tensorflow": importlib.metadata.version(tensorflow_distribution())}
    assert [n for n in names if not n.startswith(NAMESPACED)] == []
    assert not [n for n in names if n.startswith(("experiments/", "models/", "tests/"))]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_fresh_venv_trains_a_crossed_pair_outside_the_repo(fresh_venv, lease_group, tmp_path):
    workdir = tmp_path / "user"           # outside the repository
    workdir.mkdir()
    assert REPO_ROOT not in workdir.resolve().parents
    script = shutil.copy(USER_SCRIPT, workdir / "train.py")
    barrier = workdir / "barrier"
    barrier.mkdir()
    python, horovodrun = fresh_venv / "bin" / "python", fresh_venv / "bin" / "horovodrun"
    commands = [[str(horovodrun), "--gloo", "-np", "1", "-H", "localhost:1", str(python), script,
                 str(workdir / f"{job}.json"), "--group", lease_group, "--steps", str(STEPS),
                 "--barrier", f"{barrier}:2"] for job in ("a", "b")]
    for rc, out in run_pair(commands, user_env(fresh_venv), workdir, PAIR_TIMEOUT_S):
        assert rc == 0, out[-6000:]
    a, b = (json.loads((workdir / f"{job}.json").read_text()) for job in ("a", "b"))
    for job in (a, b):
        assert pathlib.Path(job["crossover_tf"]).is_relative_to(fresh_venv), job["crossover_tf"]
        assert not job["experiments_importable"] and not job["models_importable"]
        stats = job["lease_stats"]
        assert stats["acquires"] == 2 * STEPS and not stats["held"], stats   # compute + apply
    print("lease stats:", a["lease_stats"], b["lease_stats"])
    assert a["lease_stats"]["handoffs"] + b["lease_stats"]["handoffs"] > 0   # one shared lease


@pytest.mark.slow
def test_the_readme_install_is_small_and_builds_the_op_for_this_tensorflow(readme_venv):
    """Issue 51: the README's words work with the current pip (build isolation on); the
    environment gets no experiments' packages; the op was compiled once, on the README's
    first use, for the TensorFlow installed, into the cache."""
    venv, cache, timing = readme_venv
    pip = run_checked([str(venv / "bin" / "python"), "-m", "pip", "--version"], 60)
    assert int(pip.split()[1].split(".")[0]) >= 25, pip          # today's pip, not the venv's
    site = next((venv / "lib").glob("python3.*/site-packages"))
    lease = site / "crossover_tf" / "lease"
    assert not (lease / "_lease_ops.so").exists()                # built against no TensorFlow
    assert (lease / "op_sources" / "Makefile").is_file()
    assert (lease / "_lease_observer.so").is_file() and (lease / "_bind_address.so").is_file()
    for extra in ("tensorflow_datasets", "matplotlib", "tensorboard", "horovod"):
        assert not (site / extra).exists(), extra
    (entry,) = [p for p in (cache / "ops").iterdir() if p.is_dir()]
    record = json.loads((entry / "_lease_ops.build.json").read_text())
    assert record == {"tensorflow": importlib.metadata.version(tensorflow_distribution())}
    assert entry.name.startswith(f"tf{record['tensorflow']}-cp311-")
    size_mb = sum(p.stat().st_size for p in venv.rglob("*") if p.is_file()) / 2**20
    print(f"README install {timing['install_s']:.1f} s (op compile included); "
          f"venv {size_mb:.0f} MB")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_readme_install_crosses_a_pair_with_no_backend_option(readme_venv, lease_group,
                                                                 tmp_path):
    """Issue 33 and 51: installed the README's way beside a stock TensorFlow, no Horovod, two
    jobs of two ranks each (python -m crossover_tf.launch, no backend option: "auto") cross
    through TensorFlow's collectives, and asking for the Horovod backend fails with one line
    that says how to install it."""
    venv, cache, _ = readme_venv
    workdir = tmp_path / "user"
    workdir.mkdir()
    script = shutil.copy(USER_SCRIPT, workdir / "train.py")
    barrier = workdir / "barrier"
    barrier.mkdir()
    python = str(venv / "bin" / "python")
    env = user_env(venv, cache)
    commands = [[python, "-m", "crossover_tf.launch", "-np", "2", "--timeout_s",
                 str(PAIR_TIMEOUT_S), "--", python, script, str(workdir / f"{job}_RANK.json"),
                 "--group", lease_group, "--steps", str(STEPS), "--barrier", f"{barrier}:4"]
                for job in ("a", "b")]
    for rc, out in run_pair(commands, env, workdir, PAIR_TIMEOUT_S + 30):
        assert rc == 0, out[-6000:]    # without Horovod installed: "auto" picked TensorFlow's
    for job in ("a", "b"):
        ranks = [json.loads((workdir / f"{job}_{r}.json").read_text()) for r in range(2)]
        for rank in ranks:
            assert not rank["horovod_importable"] and rank["size"] == 2
            assert pathlib.Path(rank["crossover_tf"]).is_relative_to(venv)
            stats = rank["lease_stats"]
            assert stats["acquires"] == 2 * STEPS and not stats["held"], stats

    asked = subprocess.run([python, "-c", "import crossover_tf; crossover_tf.CrossoverStrategy("
                            "communication=crossover_tf.CommunicationOptions(backend='horovod'))"],
                           env=env, cwd=workdir, capture_output=True, text=True, timeout=300)
    assert asked.returncode != 0
    last = asked.stderr.strip().splitlines()[-1]
    assert "the horovod backend needs Horovod 0.28.1" in last, asked.stderr[-3000:]
    assert "pip install 'crossover_tf[horovod]'" in last and "backend='tensorflow'" in last
