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
a library; a waiter looks for it before and while it waits, so whoever keeps the lock cannot
stall a first use once the library is there.

The cache trusts only its owner (trusted_path.py: the lease directory's rule): the key is
predictable, so a cache folder another user made first or may write (under /tmp, shared by a
group) would let them put a library there for the next user to load, or a link where the lock
or the failed build's log is written. Such a cache is refused, naming the path and the fix; the
library must be root's or this user's, writable by nobody else, and match the digest written
beside it at build time; the lock is never followed through a link, never written, and a lock
another user holds is refused at once, naming the pid the kernel reports.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import pathlib
import platform
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping

from absl import logging

from crossover_tf.lease import trusted_path
from crossover_tf.lease.file_lock import flock_holder, flock_within
from crossover_tf.lease.library_paths import OP_LIBRARY, OP_SOURCE_GLOBS

LIBRARY_NAME = OP_LIBRARY
RECORD_NAME = pathlib.Path(OP_LIBRARY).with_suffix(".build.json").name  # as the loader reads
DIGEST_NAME = pathlib.Path(OP_LIBRARY).with_suffix(".sha256").name  # the library's, at build
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
    into it now (one process at a time; the others wait up to timeout_s for it). Raises
    OpBuildError where the cache or its library fails the trust rule."""
    root = root or cache_root()
    key = build_key(tf_version, sources)
    library = _published(root, key)
    if library is not None:
        return library
    missing = missing_tools()
    if missing:
        raise OpBuildError(NO_TOOLS.format(tf_version=tf_version, missing=" and ".join(missing)
                                           + (" were" if len(missing) > 1 else " was")))
    folder = _trusted(root, create=True)
    with _exclusive(folder, key, timeout_s) as library:
        if library is None:           # this process holds the lock and nobody built it yet
            _compile(sources, folder, key, python, timeout_s)
            library = _published(folder, key)
    return library


def _trusted(root: pathlib.Path, name: str = "", create: bool = False) -> pathlib.Path | None:
    """root/name resolved and checked by the trust rule (made where missing, if create); None
    if it is missing. A refusal names the cache, root, and the component that failed."""
    try:
        return trusted_path.trusted_dir(root / name, create=create)
    except trusted_path.UntrustedPathError as err:
        _refuse_untrusted(root, err.problem)
    except NotADirectoryError as err:  # a component on the path is a file, not a folder
        raise OpBuildError(f"the op library cache {root} cannot be used: {err}; set "
                           "CROSSOVER_CACHE to a folder") from err
    except OSError as err:
        raise OpBuildError(f"cannot create the op library cache {root} ({err}); set "
                           "CROSSOVER_CACHE to a folder this user can write") from err


def _published(root: pathlib.Path, key: str) -> pathlib.Path | None:
    """The entry's library if it is published and may be loaded; None where there is none to
    load yet (no entry, or one from before digests: rebuilt). Raises OpBuildError where the
    entry, its library or its digest fails the trust rule or the library changed since."""
    entry = _trusted(root, key)
    if entry is None:
        return None
    library, digest = entry / LIBRARY_NAME, entry / DIGEST_NAME
    try:
        for path in (library, digest):
            _refuse_untrusted(root, trusted_path.file_problem(path, os.lstat(path)))
        expected = digest.read_text().strip()
    except FileNotFoundError:
        return None
    if file_digest(library) != expected:
        raise OpBuildError(f"the op library {library} does not match the digest recorded "
                           f"beside it when it was built ({digest}): it changed since. If "
                           f"nobody else could have changed it, remove {entry} to have it "
                           "rebuilt")
    return library


def _refuse_untrusted(root: pathlib.Path, problem: str) -> None:
    """Raises the cache's refusal where something on its path fails the trust rule."""
    if problem:
        raise OpBuildError(trusted_path.refusal("crossover_tf's op library cache", root,
                                                problem))


def file_digest(path: pathlib.Path) -> str:
    """The sha256 of path's bytes, as the digest record holds it."""
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


@contextlib.contextmanager
def _exclusive(root: pathlib.Path, key: str,
               timeout_s: float) -> Iterator[pathlib.Path | None]:
    """Holds the build lock and yields None, or yields the library another process published
    meanwhile. Waits at most timeout_s for a holder of this user's, none for another user's."""
    lock_path = root / f"{key}.lock"
    fd = _open_lock(root, lock_path)
    try:
        deadline = time.monotonic() + timeout_s
        while not flock_within(fd, min(LOCK_POLL_S, timeout_s)):
            library = _published(root, key)
            if library is not None:
                yield library
                return
            holder = _holder_text(fd, lock_path)
            if time.monotonic() >= deadline:
                raise OpBuildError(
                    f"another process ({holder}) has been building the op library {key} for "
                    f"over {timeout_s:.0f} s (lock {lock_path}); if it is stuck, stop it and "
                    "run again")
        yield _published(root, key)   # else another process built it while this one waited
    finally:
        os.close(fd)                  # releases the lock


def _open_lock(root: pathlib.Path, lock_path: pathlib.Path) -> int:
    """The lock file, read-only (it is never written), made 0600 so no other user can open it
    to hold it; a link is refused, not followed, and so is a file of another user's."""
    flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(lock_path, flags, 0o600)
    except OSError as err:       # ELOOP; EACCES where O_CREAT meets a link in a sticky folder
        if err.errno == errno.ELOOP or lock_path.is_symlink():
            _refuse_untrusted(root, f"{lock_path} is a symbolic link, which is never followed")
        raise OpBuildError(f"cannot open the op library cache's build lock {lock_path} "
                           f"({err.strerror}); set CROSSOVER_CACHE to a folder this user can "
                           "write") from err
    st = os.fstat(fd)
    problem = trusted_path.file_problem(lock_path, st) or (
        f"{lock_path} has {st.st_nlink} hard links" if st.st_nlink > 1 else "")
    if problem:
        os.close(fd)
        _refuse_untrusted(root, problem)
    if st.st_uid == os.geteuid() and st.st_mode & 0o077:
        os.fchmod(fd, 0o600)          # a lock made before: nobody else may open it from now
    return fd


def _holder_text(fd: int, lock_path: pathlib.Path) -> str:
    """Who holds the lock, from the kernel's table; raises OpBuildError at once if it is
    another user (they opened the lock while it was readable: they must not stall this one)."""
    pid = flock_holder(fd)
    try:
        uid = os.stat(f"/proc/{pid}").st_uid if pid else None
    except OSError:           # gone since
        uid = None
    if uid not in (None, 0, os.geteuid()):
        raise OpBuildError(
            f"the op library cache's build lock {lock_path} is held by process {pid} of uid "
            f"{uid}, another user: this process will not wait for them. Stop that process, "
            f"or {trusted_path.FIX}")
    return f"pid {pid}" if pid else "pid unknown"


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
        kept = _keep_log(log_path, root / f"{key}.failed.log")
        if kept != log_path:
            shutil.rmtree(staging, ignore_errors=True)
        tail = "\n".join(kept.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
        raise OpBuildError(f"compiling the lease op library failed ({failure}): "
                           f"{shlex.join(command)}\n{tail}\n(full log: {kept})")
    _seal(staging)
    shutil.rmtree(root / key, ignore_errors=True)   # an entry someone emptied by hand
    os.rename(staging, root / key)
    logging.info("crossover_tf: lease op library built in %.0f s", time.monotonic() - start)


def _keep_log(log_path: pathlib.Path, kept: pathlib.Path) -> pathlib.Path:
    """Moves the failed build's log to kept with a rename, which replaces whatever is there (a
    link included) and writes through nothing; where it cannot, the log stays where it is."""
    try:
        os.replace(log_path, kept)
        return kept
    except OSError:
        return log_path


def _seal(staging: pathlib.Path) -> None:
    """Makes the build loadable under the trust rule: nothing in it writable by group or
    others (make ran under the user's umask), its library's digest recorded beside it."""
    for path in staging.iterdir():
        path.chmod(stat.S_IMODE(path.stat().st_mode) & ~0o022)
    (staging / DIGEST_NAME).write_text(file_digest(staging / LIBRARY_NAME) + "\n")
    staging.chmod(0o755)              # mkdtemp's 0700 would hide a root-made cache's from users
