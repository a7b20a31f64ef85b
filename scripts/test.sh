#!/usr/bin/env bash
# The project's test command (README; .ci/run calls exactly this): install (cached), lint with
# ruff (ruff.toml; a lint error fails the run), the Bazel build and C++ test of the op library
# (scripts/bazel_check.sh: ~1 min warm; a SKIPPED line where neither Bazel nor apt is there;
# CROSSOVER_BAZEL_CHECK=0 leaves it out), then pytest.
# Extra arguments go to pytest. The fast tier (under 3 min of pytest on 2 cores) leaves out the
# end-to-end and multi-process tests, marked `slow` (pyproject.toml):
#   CROSSOVER_BAZEL_CHECK=0 bash scripts/test.sh -m "not slow"
# CI (.ci/run) runs everything.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${CROSSOVER_VENV:-$ROOT/.venv}
bash "$ROOT/scripts/install.sh"
cd "$ROOT"
"$VENV/bin/ruff" check .
if [ "${CROSSOVER_BAZEL_CHECK:-1}" = 0 ]; then
  echo "SKIPPED: scripts/bazel_check.sh (CROSSOVER_BAZEL_CHECK=0)"
else
  bash "$ROOT/scripts/bazel_check.sh"
fi
bash "$ROOT/scripts/install_slurm.sh"  # apt slurm-wlm + munge for tests/system/test_deploy_slurm.py, or SKIPPED
bash "$ROOT/scripts/install_prometheus.sh"  # apt prometheus + promtool for tests/support/prometheus_server.py, or SKIPPED
set +e
"$VENV/bin/python" -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  # pytest's "no tests collected": test discovery is broken, which must not pass as green.
  echo "scripts/test.sh: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
