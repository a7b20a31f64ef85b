"""`python -m benchmarks.exporter_hostile_clients --short`: the benchmark of the exporter's
server under hostile clients (issue 59, items 8 and 9) runs and prints its result lines, so
that it does not rot unseen (benchmarks/common.py). It starts the server and the slow clients
as processes of their own, hence this tier. Its figures are in docs/measurements.md.
"""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

pytest.importorskip("prometheus_client", reason="prometheus-client (scripts/install.sh)")
pytest.importorskip("yaml", reason="PyYAML (the exporter extra; scripts/install.sh)")
pytest.importorskip("bcrypt", reason="bcrypt (the exporter extra; scripts/install.sh)")
pytestmark = pytest.mark.multiprocess


@pytest.mark.parametrize("case, words", [
    ("wrong_passwords", "answered 401"), ("slow_clients", "correct scrapes answered"),
])
def test_the_hostile_clients_benchmark_prints_its_results(child_env, case, words):
    """Its result lines, every request answered."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed (it makes the server's certificate)")
    out = subprocess.run([sys.executable, "-m", "benchmarks.exporter_hostile_clients", "--short",
                          "--case", case], capture_output=True, text=True, timeout=180,
                         env=child_env, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("result:")]
    assert lines and all(words in line for line in lines), out.stdout
    if case == "wrong_passwords":
        assert all(" 10 answered 401" in line for line in lines), lines
    else:
        assert lines[0].startswith("result: 2 of 2 correct scrapes answered"), lines
