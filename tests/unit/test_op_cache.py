"""The op library's first-use build cache (crossover_tf/lease/op_cache.py): its key, its lock,
its failures. A stand-in `make` on PATH takes the compiler's place (it writes the library file,
slowly, and counts its runs), so the cache's own behaviour is what is tested here;
tests/system/test_wheel.py compiles the real op this way in a fresh environment."""
from __future__ import annotations

import concurrent.futures
import fcntl
import json
import os
import pathlib
import stat

import pytest

from crossover_tf.lease import loader, op_cache
from crossover_tf.lease.library_paths import REPO_OPS

FAKE_MAKE = """#!/bin/sh
# make -C SRC PYTHON=... OUT=... RECORD=... op: counts its runs, takes a while, then writes OUT
echo run >> "{runs}"
for arg in "$@"; do
  case "$arg" in OUT=*) out=${{arg#OUT=}};; RECORD=*) record=${{arg#RECORD=}};; esac
done
sleep {sleep_s}
[ -n "{fail}" ] && {{ echo "lease_kernels.cc:1: error: made to fail"; exit 2; }}
echo library > "$out"
echo '{{"tensorflow": "9.9.9"}}' > "$record"
"""


@pytest.fixture
def sources(tmp_path: pathlib.Path) -> pathlib.Path:
    """A copy of the op's sources (what a wheel carries), so a test may change one."""
    folder = tmp_path / "op_sources"
    for path in op_cache.source_files(REPO_OPS):
        target = folder / path.relative_to(REPO_OPS)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    return folder


def fake_make(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, sleep_s: float = 0.0,
              fail: bool = False) -> pathlib.Path:
    """Puts the stand-in make first on PATH; returns the file it counts its runs in."""
    bin_dir, runs = tmp_path / "bin", tmp_path / "make_runs"
    bin_dir.mkdir(exist_ok=True)
    make = bin_dir / "make"
    make.write_text(FAKE_MAKE.format(runs=runs, sleep_s=sleep_s, fail="1" if fail else ""))
    make.chmod(make.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return runs


def run_count(runs: pathlib.Path) -> int:
    return len(runs.read_text().splitlines()) if runs.exists() else 0


def test_the_key_follows_the_tensorflow_version_and_every_source(sources):
    key = op_cache.build_key("2.21.0", sources)
    assert key.startswith("tf2.21.0-cp311-") and key == op_cache.build_key("2.21.0", sources)
    assert op_cache.build_key("2.21.1", sources) != key
    (sources / "notes.txt").write_text("not a source")
    assert op_cache.build_key("2.21.0", sources) == key
    kernels = sources / "tf" / "lease_kernels.cc"
    kernels.write_text(kernels.read_text() + "\n// changed\n")
    assert op_cache.build_key("2.21.0", sources) != key
    assert {"Makefile", "tf/lease_ops.cc", "core/device_lease.h"} <= {
        p.relative_to(sources).as_posix() for p in op_cache.source_files(sources)}


def test_the_cache_lives_where_the_environment_says(monkeypatch):
    assert op_cache.cache_root({"CROSSOVER_CACHE": "/c"}) == pathlib.Path("/c/ops")
    assert op_cache.cache_root({"XDG_CACHE_HOME": "/x"}) == pathlib.Path("/x/crossover_tf/ops")
    monkeypatch.setenv("HOME", "/home/u")
    assert op_cache.cache_root({}) == pathlib.Path("/home/u/.cache/crossover_tf/ops")


def test_concurrent_first_uses_build_once_and_all_load_the_published_library(
        sources, tmp_path, monkeypatch):
    """Four ranks starting at once: one compiles, the others wait on the lock and get its
    library; a later process builds nothing."""
    runs = fake_make(tmp_path, monkeypatch, sleep_s=1.0)
    root = tmp_path / "cache"
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: op_cache.cached_library("9.9.9", sources, root=root),
                              range(4)))
    assert len(set(paths)) == 1 and run_count(runs) == 1
    library = paths[0]
    assert library.read_text() == "library\n"
    assert json.loads(loader.build_record_path(library).read_text()) == {"tensorflow": "9.9.9"}
    assert library.parent.name == op_cache.build_key("9.9.9", sources)
    assert stat.S_IMODE(library.parent.stat().st_mode) == 0o755   # a shared cache's group reads
    assert not list(root.glob("*.building"))                       # nothing half-made left
    assert op_cache.cached_library("9.9.9", sources, root=root) == library
    assert run_count(runs) == 1


def test_a_failed_compile_says_why_keeps_its_log_and_publishes_nothing(
        sources, tmp_path, monkeypatch):
    runs = fake_make(tmp_path, monkeypatch, fail=True)
    root = tmp_path / "cache"
    with pytest.raises(op_cache.OpBuildError) as err:
        op_cache.cached_library("9.9.9", sources, root=root)
    message = str(err.value)
    assert "exit status 2" in message and "made to fail" in message
    key = op_cache.build_key("9.9.9", sources)
    assert str(root / f"{key}.failed.log") in message
    assert not (root / key).exists() and not list(root.glob("*.building"))
    with pytest.raises(op_cache.OpBuildError):    # the next process tries again
        op_cache.cached_library("9.9.9", sources, root=root)
    assert run_count(runs) == 2


def test_a_build_held_too_long_by_another_process_is_an_error_naming_it(
        sources, tmp_path, monkeypatch):
    runs = fake_make(tmp_path, monkeypatch)
    root = tmp_path / "cache"
    root.mkdir()
    lock = root / f"{op_cache.build_key('9.9.9', sources)}.lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("4242")
        held.flush()
        with pytest.raises(op_cache.OpBuildError, match=r"pid 4242\) has been building"):
            op_cache.cached_library("9.9.9", sources, root=root, timeout_s=0.5)
    assert run_count(runs) == 0


@pytest.mark.parametrize("environ, missing", [
    ({"PATH": ""}, "`make` and `g++` were"),
    ({"CXX": "clang++-99 -std=c++17"}, "`clang++-99` was"),
])
def test_no_compiler_is_one_clear_error_with_the_ways_out(sources, tmp_path, monkeypatch,
                                                          environ, missing):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(op_cache.OpBuildError) as err:
        op_cache.cached_library("2.21.0", sources, root=tmp_path / "cache")
    message = str(err.value)
    assert f"{missing} not found on PATH" in message and "TensorFlow 2.21.0" in message
    assert "apt-get install make g++" in message and "--no-build-isolation" in message
    assert not (tmp_path / "cache").exists()


def test_the_loader_compiles_for_this_tensorflow_past_a_library_built_for_another(
        tmp_path, monkeypatch):
    """A wheel built against TensorFlow 2.20 under 2.21: the library beside the package is
    passed over, not loaded, and the cache's build for the running version is used."""
    beside = tmp_path / loader.LIBRARY_NAME
    beside.write_bytes(b"")
    loader.build_record_path(beside).write_text(json.dumps({"tensorflow": "2.20.0"}))
    asked = []
    monkeypatch.setattr(loader, "LIBRARY_CANDIDATES", (beside,))
    monkeypatch.setattr(op_cache, "cached_library",
                        lambda running, sources: asked.append((running, sources)) or "built")
    assert loader.library_for_this_tensorflow("2.21.0") == "built"
    assert asked == [("2.21.0", REPO_OPS)]
    loader.build_record_path(beside).write_text(json.dumps({"tensorflow": "2.21.0"}))
    assert loader.library_for_this_tensorflow("2.21.0") == beside


def test_without_a_library_or_sources_the_loader_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(loader, "LIBRARY_CANDIDATES", (tmp_path / loader.LIBRARY_NAME,))
    monkeypatch.setattr(loader, "op_sources", lambda: None)
    with pytest.raises(FileNotFoundError,
                       match=r"for TensorFlow 2\.21\.0 not found .* sources are not installed"):
        loader.library_for_this_tensorflow("2.21.0")
