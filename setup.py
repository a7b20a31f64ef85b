"""Builds crossover_tf's native libraries; all metadata lives in pyproject.toml.

A TensorFlow op library must match its TensorFlow's C++ ABI, so the device-lease op
(crossover_tf/lease/_lease_ops.so) is compiled against the TensorFlow the user runs:
- pip's default, isolated build cannot import the user's TensorFlow. The wheel then carries the
  op's sources (crossover_tf/lease/op_sources/) and the two TensorFlow-free libraries (the
  exporter's lease reader and the launcher's bind guard); the op is compiled on the first use,
  into a per-TensorFlow-version cache (crossover_tf/lease/op_cache.py):
      pip install <clone or wheel>
- a build that can import TensorFlow (`pip wheel --no-build-isolation`, scripts/install.sh's
  editable install) also compiles the op into the wheel, as tensorflow/custom-op's
  per-version wheels do, with a record of the TensorFlow it was built against; the loader uses
  it only under that TensorFlow and compiles one for any other.
Either way the compile is ops/Makefile's (`native` and `op` targets, flags from tf.sysconfig),
the same one scripts/install.sh and developers run, so the routes cannot drift apart.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.errors import CompileError, PlatformError

ROOT = pathlib.Path(__file__).resolve().parent
LEASE_OPS = "crossover_tf.lease._lease_ops"
TF_PROBE_TIMEOUT_S = 300      # importing TensorFlow takes seconds; a hung import must not hang pip
MAKE_TIMEOUT_S = 1800         # the compile takes about a minute on 2 cores


def _library_paths():
    """crossover_tf/lease/library_paths.py, loaded by path: it names the op's sources a wheel
    carries, and the package itself cannot be imported here (no TensorFlow in the build)."""
    spec = importlib.util.spec_from_file_location(
        "_crossover_library_paths", ROOT / "crossover_tf" / "lease" / "library_paths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LIBRARY_PATHS = _library_paths()


def tensorflow_version() -> str | None:
    """The version of the TensorFlow this Python imports; None if it imports none (pip's
    isolated build environment hides the user's)."""
    probe = subprocess.run([sys.executable, "-c", "import tensorflow as tf; print(tf.__version__)"],
                           capture_output=True, text=True, timeout=TF_PROBE_TIMEOUT_S,
                           env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if probe.returncode != 0:
        return None
    return probe.stdout.strip().splitlines()[-1]


def recorded_version(record: pathlib.Path) -> str | None:
    """The TensorFlow version in a build record (ops/Makefile writes it), None if unreadable."""
    try:
        return str(json.loads(record.read_text())["tensorflow"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class BuildLeaseOps(build_ext):
    """build_ext that makes _lease_ops.so with ops/Makefile instead of setuptools' compiler."""

    _in_source = False

    def run(self) -> None:
        # setuptools builds --inplace extensions in build/ and then copies them over the
        # source tree's, truncating a library that running jobs have mapped; build in place.
        self._in_source = bool(self.inplace or getattr(self, "editable_mode", False))
        super().run()

    def copy_extensions_to_source(self) -> None:
        kept, self.extensions = self.extensions, [e for e in self.extensions
                                                  if e.name != LEASE_OPS]
        try:
            super().copy_extensions_to_source()
        finally:
            self.extensions = kept

    def get_ext_filename(self, fullname: str) -> str:
        # An op library that tf.load_op_library opens by path, not a Python extension module:
        # no ABI suffix, so the loader (and the Makefile) find it as _lease_ops.so.
        # (get_ext_fullpath asks with the last name component only.)
        if fullname in (LEASE_OPS, LEASE_OPS.rpartition(".")[2]):
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def build_extension(self, ext: Extension) -> None:
        if ext.name != LEASE_OPS:
            super().build_extension(ext)
            return
        if shutil.which("make") is None:
            raise PlatformError("building crossover_tf's native libraries needs `make` and a "
                                "C++17 compiler (g++), as Horovod's build does")
        out = (ROOT / self.get_ext_filename(LEASE_OPS) if self._in_source
               else pathlib.Path(self.get_ext_fullpath(LEASE_OPS))).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        record = out.with_suffix(".build.json")
        running = tensorflow_version()
        if running is None:
            print("crossover_tf: TensorFlow is not importable in this build (pip's isolated "
                  "build): the wheel carries the op's sources, compiled on first use against "
                  "the TensorFlow it runs with", flush=True)
        # make rebuilds on changed sources, not on a changed TensorFlow: a library from an
        # earlier build (another TensorFlow, or no record of which) is removed first. Removing
        # leaves a running job's mapped copy intact.
        if running is not None and recorded_version(record) != running:
            out.unlink(missing_ok=True)
        command = ["make", "-C", str(ROOT / "ops"), f"PYTHON={sys.executable}", f"OUT={out}",
                   f"RECORD={record}", "lib" if running else "native"]
        print(" ".join(command), flush=True)
        try:
            subprocess.run(command, check=True, timeout=MAKE_TIMEOUT_S)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
            raise CompileError(f"building {out.name} failed: {err}") from err


class BuildPyWithOpSources(build_py):
    """build_py that also puts the op's sources in the package, for op_cache's first-use
    compile (an editable install finds them in the source tree's ops/ instead)."""

    def run(self) -> None:
        super().run()
        target = pathlib.Path(self.build_lib).joinpath(
            LIBRARY_PATHS.PACKAGED_SOURCES.relative_to(LIBRARY_PATHS.LEASE_PACKAGE.parents[1]))
        shutil.rmtree(target, ignore_errors=True)
        for pattern in LIBRARY_PATHS.OP_SOURCE_GLOBS:
            for source in (ROOT / "ops").glob(pattern):
                dest = target / source.relative_to(ROOT / "ops")
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, dest)


# sources=[]: the Makefile owns them; the Extension makes the wheel platform-specific.
setup(ext_modules=[Extension(LEASE_OPS, sources=[])],
      cmdclass={"build_ext": BuildLeaseOps, "build_py": BuildPyWithOpSources})
