"""What the op cache's tests share (tests/unit/test_op_cache.py, and
tests/multiprocess/test_op_cache_trust.py, which plays another user): a copy of the op's sources
and a stand-in `make` on PATH that takes the compiler's place (it writes the library file,
slowly, and counts its runs), so the cache's own behaviour is what is tested."""
from __future__ import annotations

import os
import pathlib
import stat

import pytest

from crossover_tf.lease import op_cache
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


def copy_sources(folder: pathlib.Path) -> pathlib.Path:
    """A copy of the op's sources (what a wheel carries) in folder, so a test may change one."""
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
