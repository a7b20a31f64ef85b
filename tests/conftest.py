"""Shared pytest fixtures: quiet TensorFlow logs, repo root on sys.path, unique lease groups."""
from __future__ import annotations

import os
import pathlib
import sys
import uuid

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


@pytest.fixture
def lease_group() -> str:
    """A lease group no other test (or concurrent test run) uses; its segments are removed after."""
    group = f"t{uuid.uuid4().hex[:12]}"
    yield group
    for seg in pathlib.Path("/dev/shm").glob(f"crossover.{group}.*"):
        seg.unlink(missing_ok=True)


@pytest.fixture
def child_env() -> dict[str, str]:
    """Environment for child Python processes: repo importable, TF quiet."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env
