"""`python -m experiments.compare --helpshort` lists the comparison's flags, although they are
defined in experiments/comparison/settings.py (absl lists only the main module's key flags)."""
from __future__ import annotations

import sys

import pytest
from absl import flags

from conftest import REPO_ROOT, run_bounded
from experiments import compare


def test_declared_key_flags_are_the_comparisons_flags() -> None:
    fresh = flags.FlagValues()
    compare.declare_key_flags(fresh)
    key_flags = {f.name for f in fresh.get_key_flags_for_module(compare.__name__)}
    assert key_flags == set(compare.FLAG_NAMES)
    assert "--comm_to_compute" in fresh.module_help(compare.__name__)


@pytest.mark.slow
def test_helpshort_of_the_script_lists_its_flags(child_env: dict[str, str]) -> None:
    result = run_bounded([sys.executable, "-m", "experiments.compare", "--helpshort"],
                         child_env, timeout=120, cwd=str(REPO_ROOT))
    listed = {line.split(":")[0].strip().removeprefix("--").removeprefix("[no]")
              for line in result.stdout.splitlines() if line.startswith("  --")}
    assert set(compare.FLAG_NAMES) <= listed, result.stdout[-4000:]
