"""The op library's build prints no wall of TensorFlow's header warnings, and still shows the
project's own (issue 51, item 6).

Before: every compile of the op repeated Eigen's `-Winterference-size` warning from
TensorFlow's headers (85 lines of stderr for one `make lib`; none now, QUIET_TF_HEADERS=0
brings them back). ops/Makefile now takes
TensorFlow's include directory as a system one (-isystem), where the compiler keeps quiet;
-Wall still covers our sources.
"""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from conftest import REPO_ROOT

SOURCE = """#include "tensorflow/core/framework/op.h"
int unused_on_purpose() { int ours; return 0; }
"""


def _tf_flags(quiet: str) -> list[str]:
    """The TensorFlow compile flags of the op library's compile line, as make writes it."""
    dry = subprocess.run(["make", "-n", "-C", str(REPO_ROOT / "ops"), f"PYTHON={sys.executable}",
                          f"QUIET_TF_HEADERS={quiet}", "OUT=/nonexistent/_lease_ops.so", "lib"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    line = next(x for x in dry.splitlines() if "-shared" in x and "tf/lease_ops.cc" in x)
    return re.findall(r"(-isystem \S+|-I\S*tensorflow\S*|-D\S+|--std=\S+)", line)


def _warnings(flags: list[str], tmp_path: pathlib.Path) -> list[str]:
    source = tmp_path / "probe.cc"
    source.write_text(SOURCE)
    done = subprocess.run(["g++", "-std=c++17", "-Wall", "-c", *" ".join(flags).split(),
                           str(source), "-o", str(tmp_path / "probe.o")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return [x for x in done.stderr.splitlines() if "warning:" in x]


def test_tensorflow_headers_are_quiet_and_ours_still_warn(tmp_path):
    quiet = _tf_flags("1")
    assert any(f.startswith("-isystem ") and f.endswith("tensorflow/include") for f in quiet)
    warnings = _warnings(quiet, tmp_path)
    assert len(warnings) == 1, warnings
    assert "unused variable" in warnings[0] and "ours" in warnings[0], warnings
    loud = _warnings(_tf_flags("0"), tmp_path)  # QUIET_TF_HEADERS=0: TensorFlow's own again
    assert any("tensorflow/include" in w for w in loud), loud
