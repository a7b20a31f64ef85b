"""Builds crossover_tf; all metadata lives in setup.cfg.

The device-lease op library (crossover_tf/lease/_lease_ops.so) is compiled here, at install
time, against the TensorFlow that this Python imports, the way Horovod builds its ops: a TF op
library must match its TensorFlow's C++ ABI, so the wheel is specific to that TensorFlow,
Python and platform (tagged e.g. cp311-cp311-linux_x86_64). TensorFlow must therefore be
installed first and visible to the build, which pip's isolated build environment would hide:

    pip install tensorflow-cpu==2.21.0 && pip install --no-build-isolation .

The compile itself is ops/Makefile's `lib` target (flags from tf.sysconfig), the same one
scripts/install.sh and developers run, so the pip and make builds cannot drift apart.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError, PlatformError

ROOT = pathlib.Path(__file__).resolve().parent
LEASE_OPS = "crossover_tf.lease._lease_ops"
TF_PROBE_TIMEOUT_S = 300      # importing TensorFlow takes seconds; a hung import must not hang pip
MAKE_TIMEOUT_S = 1800         # the compile takes about a minute on 2 cores
NO_TENSORFLOW = """crossover_tf compiles its TensorFlow op library at install time, against the
installed TensorFlow, but `import tensorflow` fails in {python}:
    {error}
Install TensorFlow first, then build without pip's isolated build environment:
    pip install tensorflow-cpu==2.21.0    # or tensorflow, for GPUs
    pip install --no-build-isolation .    # likewise for `pip wheel` and `pip install -e`"""


def tensorflow_version() -> str:
    """The version of the TensorFlow this Python imports; a clear error if it imports none."""
    probe = subprocess.run([sys.executable, "-c", "import tensorflow as tf; print(tf.__version__)"],
                           capture_output=True, text=True, timeout=TF_PROBE_TIMEOUT_S,
                           env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if probe.returncode != 0:
        error = (probe.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise PlatformError(NO_TENSORFLOW.format(python=sys.executable, error=error))
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
        running = tensorflow_version()
        if shutil.which("make") is None:
            raise PlatformError("building crossover_tf's op library needs `make` and a C++17 "
                                "compiler (g++), as Horovod's build does")
        out = (ROOT / self.get_ext_filename(LEASE_OPS) if self._in_source
               else pathlib.Path(self.get_ext_fullpath(LEASE_OPS))).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        record = out.with_suffix(".build.json")
        # make rebuilds on changed sources, not on a changed TensorFlow: a library from an
        # earlier build (another TensorFlow, or no record of which) is removed first. Removing
        # leaves a running job's mapped copy intact.
        if recorded_version(record) != running:
            out.unlink(missing_ok=True)
        command = ["make", "-C", str(ROOT / "ops"), f"PYTHON={sys.executable}", f"OUT={out}",
                   f"RECORD={record}", "lib"]
        print(" ".join(command), flush=True)
        try:
            subprocess.run(command, check=True, timeout=MAKE_TIMEOUT_S)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
            raise CompileError(f"building {out.name} failed: {err}") from err


# sources=[]: the Makefile owns them; the Extension makes the wheel platform-specific.
setup(ext_modules=[Extension(LEASE_OPS, sources=[])],
      cmdclass={"build_ext": BuildLeaseOps})
