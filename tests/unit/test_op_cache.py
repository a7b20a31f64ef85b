"""The op library's first-use build cache (crossover_tf/lease/op_cache.py): its key, its lock,
its failures, its trust in its own files. A stand-in `make` on PATH takes the compiler's place
(tests/support/op_cache_fakes.py), so the cache's own behaviour is what is tested here (playing
another user: tests/multiprocess/test_op_cache_trust.py); tests/system/test_wheel.py compiles the
real op this way in a fresh environment."""
from __future__ import annotations

import concurrent.futures
import fcntl
import json
import os
import pathlib
import stat
import time

import pytest

from op_cache_fakes import copy_sources, fake_make, run_count
from crossover_tf.lease import loader, op_cache
from crossover_tf.lease.library_paths import REPO_OPS


@pytest.fixture
def sources(tmp_path: pathlib.Path) -> pathlib.Path:
    return copy_sources(tmp_path / "op_sources")


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
    """The holder named is the kernel's (/proc/locks), not a pid written in the file, which
    whoever opened it could have chosen."""
    runs = fake_make(tmp_path, monkeypatch)
    root = tmp_path / "cache"
    root.mkdir()
    lock = root / f"{op_cache.build_key('9.9.9', sources)}.lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("4242")
        held.flush()
        with pytest.raises(op_cache.OpBuildError) as err:
            op_cache.cached_library("9.9.9", sources, root=root, timeout_s=0.5)
    assert f"another process (pid {os.getpid()}) has been building" in str(err.value)
    assert "4242" not in str(err.value)
    assert run_count(runs) == 0


def test_a_lock_that_is_a_link_is_refused_and_truncates_nothing(sources, tmp_path,
                                                                 monkeypatch):
    """Before: the lock was opened with O_CREAT and no O_NOFOLLOW, then truncated and written,
    through a link to any file (issue 59, 2)."""
    runs = fake_make(tmp_path, monkeypatch)
    root, precious = tmp_path / "cache", tmp_path / "precious"
    root.mkdir()
    precious.write_text("keep me\n")
    lock = root / f"{op_cache.build_key('9.9.9', sources)}.lock"
    lock.symlink_to(precious)
    with pytest.raises(op_cache.OpBuildError) as err:
        op_cache.cached_library("9.9.9", sources, root=root)
    assert f"{lock} is a symbolic link" in str(err.value)
    assert "remove what another user made there" in str(err.value)
    assert precious.read_text() == "keep me\n" and run_count(runs) == 0


def test_a_failed_log_replaces_a_link_instead_of_writing_through_it(sources, tmp_path,
                                                                     monkeypatch):
    """Before: shutil.copyfile wrote the log through a link at <key>.failed.log."""
    fake_make(tmp_path, monkeypatch, fail=True)
    root, precious = tmp_path / "cache", tmp_path / "precious"
    root.mkdir()
    precious.write_text("keep me\n")
    kept = root / f"{op_cache.build_key('9.9.9', sources)}.failed.log"
    kept.symlink_to(precious)
    with pytest.raises(op_cache.OpBuildError, match="made to fail"):
        op_cache.cached_library("9.9.9", sources, root=root)
    assert precious.read_text() == "keep me\n"
    assert not kept.is_symlink() and "made to fail" in kept.read_text()


def test_a_published_library_is_loaded_only_as_it_was_built(sources, tmp_path, monkeypatch):
    """The entry's library must be this user's (or root's), writable by nobody else, and match
    the digest written beside it when it was built; an entry from before digests is rebuilt."""
    runs = fake_make(tmp_path, monkeypatch)
    root = tmp_path / "cache"
    library = op_cache.cached_library("9.9.9", sources, root=root)
    library.chmod(0o666)
    with pytest.raises(op_cache.OpBuildError,
                       match=rf"{library} .*writable by its group or by others.*CROSSOVER_CACHE"):
        op_cache.cached_library("9.9.9", sources, root=root)
    library.chmod(0o755)
    library.write_text("changed\n")
    with pytest.raises(op_cache.OpBuildError) as err:
        op_cache.cached_library("9.9.9", sources, root=root)
    assert f"{library} does not match the digest" in str(err.value)
    assert f"remove {library.parent}" in str(err.value)
    (library.parent / op_cache.DIGEST_NAME).unlink()     # as an entry built before digests
    assert op_cache.cached_library("9.9.9", sources, root=root) == library
    assert library.read_text() == "library\n" and run_count(runs) == 2


def test_a_waiter_takes_the_library_published_while_the_lock_is_still_held(
        sources, tmp_path, monkeypatch):
    """Before: a rank waiting on the lock looked for the library only once it had the lock, so
    whoever kept holding it (a reader, in a 0755 home) stalled it although the library was
    there (issue 59, 3)."""
    fake_make(tmp_path, monkeypatch)
    root = tmp_path / "cache"
    library = op_cache.cached_library("9.9.9", sources, root=root)
    library.parent.rename(root / "away")
    with open(root / f"{library.parent.name}.lock") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiter = pool.submit(op_cache.cached_library, "9.9.9", sources, root=root,
                                 timeout_s=5)
            time.sleep(0.5)
            (root / "away").rename(library.parent)
            assert waiter.result(timeout=3) == library


def test_a_cache_reached_through_this_users_link_is_used(sources, tmp_path, monkeypatch):
    """The normal case the trust rule keeps: a link of one's own (~/.cache on another disk)."""
    runs = fake_make(tmp_path, monkeypatch)
    (tmp_path / "disk").mkdir()
    (tmp_path / "home").symlink_to(tmp_path / "disk")
    library = op_cache.cached_library("9.9.9", sources, root=tmp_path / "home" / "ops")
    assert library.read_text() == "library\n" and run_count(runs) == 1
    assert (tmp_path / "disk" / "ops" / library.parent.name / library.name).exists()


def test_a_cache_folder_others_may_write_is_refused_and_nothing_is_made_in_it(
        sources, tmp_path, monkeypatch):
    """Before: a group-writable cache (several users sharing one) was used as it was: any
    member could replace the library another would load (issue 59, 1)."""
    runs = fake_make(tmp_path, monkeypatch)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o2775)
    with pytest.raises(op_cache.OpBuildError) as err:
        op_cache.cached_library("9.9.9", sources, root=shared / "ops")
    message = str(err.value)
    assert f"op library cache {shared / 'ops'} fails the trust rule" in message
    assert f"{shared} (owner " in message and "mode 2775) is writable by its group" in message
    assert "install -d -m 0700" in message
    assert list(shared.iterdir()) == [] and run_count(runs) == 0


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
