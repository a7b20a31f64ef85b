"""Compiles the lease op library against the running TensorFlow at its first use, once per
TensorFlow version, Python, machine and source, into a cache that every process of the user
shares.

Why at first use: a TensorFlow op library must match its TensorFlow's C++ ABI, and pip's
default, isolated build cannot see the TensorFlow the user has. So a wheel built the default way
carries the op's sources (crossover_tf/lease/op_sources/), and the first process that needs the
op compiles them with the source tree's own ops/Makefile (its `op` target, flags from
tf.sysconfig): one build for the pip, make and first-use routes. DeepSpeed's op builder and
torch.utils.cpp_extension.load compile PyTorch ops the same way; a wheel built against the
TensorFlow at hand (pip's --no-build-isolation, as tensorflow/custom-op's per-version wheels)
carries the library and skips this.

Every rank of both jobs may start at once: one builds under an exclusive lock (flock on
<key>.lock, released by the kernel if the builder dies), the others wait for it, bounded, then
load what it published. A build is published by renaming its folder, so no reader ever sees half
a library.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping

from absl import logging

from crossover_tf.lease.file_lock import flock_within
from crossover_tf.lease.library_paths import OP_LIBRARY, OP_SOURCE_GLOBS

LIBRARY_NAME = OP_LIBRARY
RECORD_NAME = pathlib.Path(OP_LIBRARY).with_suffix(".build.json").name  # as the loader reads
BUILD_TIMEOUT_S = 900.0      # the compile takes about a minute on 2 idle cores
LOCK_POLL_S = 0.25
LOG_TAIL_LINES = 40
NO_TOOLS = """crossover_tf compiles its TensorFlow op library on first use, against the TensorFlow
it runs with (TensorFlow {tf_version} here), which needs `make` and a C++17 compiler:
{missing} not found on PATH. Either install them once (Debian/Ubuntu: apt-get install make g++;
RHEL/Fedora: dnf install make gcc-c++; set CXX to name another compiler), or install a
crossover_tf wheel that carries the library, built where a compiler and this TensorFlow are:
    pip wheel --no-build-isolation --no-deps <crossover_tf source> -w dist"""


class OpBuildError(RuntimeError):
    """The op library could not be compiled (no compiler, a failed compile, a cache that cannot
    be written, or another process's build that did not finish in time)."""


def cache_root(environ: Mapping[str, str] = os.environ) -> pathlib.Path:
    """$CROSSOVER_CACHE/ops, else $XDG_CACHE_HOME/crossover_tf/ops, else
    ~/.cache/crossover_tf/ops (scripts/install.sh keeps its Horovod wheels in the same cache)."""
    base = environ.get("CROSSOVER_CACHE") or os.path.join(
        environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "crossover_tf")
    return pathlib.Path(base) / "ops"


def source_files(sources: pathlib.Path) -> list[pathlib.Path]:
    """The op library's sources under `sources`, in a fixed order."""
    return sorted(path for pattern in OP_SOURCE_GLOBS for path in sources.glob(pattern))


def source_digest(sources: pathlib.Path) -> str:
    """A digest of the sources' names and contents: another crossover_tf gets another build."""
    digest = hashlib.sha256()
    for path in source_files(sources):
        digest.update(path.relative_to(sources).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build_key(tf_version: str, sources: pathlib.Path) -> str:
    """The cache entry's name: what the library's ABI depends on, and the sources."""
    python = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    return f"tf{tf_version}-{python}-{platform.machine()}-{source_digest(sources)}"


def missing_tools(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The build tools the Makefile needs that PATH lacks ($CXX, else g++; make)."""
    compiler = (shlex.split(environ.get("CXX", "")) or ["g++"])[0]
    return [f"`{tool}`" for tool in ("make", compiler)
            if shutil.which(tool, path=environ.get("PATH")) is None]


def cached_library(tf_version: str, sources: pathlib.Path, python: str = sys.executable,
                   root: pathlib.Path | None = None,
                   timeout_s: float = BUILD_TIMEOUT_S) -> pathlib.Path:
    """The op library for `tf_version` built from `sources`: from the cache, else compiled
    into it now (one process at a time; the others wait up to timeout_s for it)."""
    root = root or cache_root()
    key = build_key(tf_version, sources)
    library = root / key / LIBRARY_NAME
    if library.exists():
        return library
    missing = missing_tools()
    if missing:
        raise OpBuildError(NO_TOOLS.format(tf_version=tf_version, missing=" and ".join(missing)
                                           + (" were" if len(missing) > 1 else " was")))
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OpBuildError(f"cannot create the op library cache {root} ({err}); set "
                           "CROSSOVER_CACHE to a folder this user can write") from err
    with _exclusive(root / f"{key}.lock", timeout_s, key):
        if not library.exists():      # else another process built it while this one waited
            _compile(sources, root, key, python, timeout_s)
    return library


@contextlib.contextmanager
def _exclusive(lock_path: pathlib.Path, timeout_s: float, key: str) -> Iterator[None]:
    """Holds an exclusive flock on lock_path, waiting at most timeout_s for another holder."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not flock_within(fd, timeout_s, LOCK_POLL_S):
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise OpBuildError(
                f"another process (pid {holder}) has been building the op library {key} for "
                f"over {timeout_s:.0f} s (lock {lock_path}); if it is stuck, stop it and run "
                "again")
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)                  # releases the lock


def _compile(sources: pathlib.Path, root: pathlib.Path, key: str, python: str,
             timeout_s: float) -> None:
    """Runs ops/Makefile's `op` target into a staging folder, then publishes it as root/key."""
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f"{key}.", suffix=".building", dir=root))
    log_path = staging / "build.log"
    command = ["make", "-C", str(sources), f"PYTHON={python}", f"OUT={staging / LIBRARY_NAME}",
               f"RECORD={staging / RECORD_NAME}", "op"]
    logging.warning("crossover_tf: compiling the lease op library for %s into %s (about a "
                    "minute, once per TensorFlow version)", key, root)
    start = time.monotonic()
    try:
        with open(log_path, "w") as log:
            done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout_s,
                                  env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        failure = None if done.returncode == 0 else f"exit status {done.returncode}"
    except subprocess.TimeoutExpired:
        failure = f"no result after {timeout_s:.0f} s"
    if failure is None and not (staging / LIBRARY_NAME).exists():
        failure = f"make made no {LIBRARY_NAME}"
    if failure is not None:
        kept = root / f"{key}.failed.log"
        shutil.copyfile(log_path, kept)
        shutil.rmtree(staging, ignore_errors=True)
        tail = "\n".join(kept.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
        raise OpBuildError(f"compiling the lease op library failed ({failure}): "
                           f"{shlex.join(command)}\n{tail}\n(full log: {kept})")
    staging.chmod(0o755)              # mkdtemp's 0700 would hide it from a shared cache's group
    shutil.rmtree(root / key, ignore_errors=True)   # an entry someone emptied by hand
    os.rename(staging, root / key)
    logging.info("crossover_tf: lease op library built in %.0f s", time.monotonic() - start)
