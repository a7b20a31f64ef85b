#!/usr/bin/env bash
# The project's test command (README; .ci/run calls exactly this): install (cached), lint with
# ruff (ruff.toml; a lint error fails the run), then pytest.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"`.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${CROSSOVER_VENV:-$ROOT/.venv}
bash "$ROOT/scripts/install.sh"
cd "$ROOT"
"$VENV/bin/ruff" check .
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
