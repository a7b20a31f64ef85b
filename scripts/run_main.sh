#!/usr/bin/env bash
# The project's main job (README): install (cached), then run the side-by-side comparison of a
# crossover pair against solo, sequential and naive co-location on an emulated two-host
# cluster (network namespaces, bandwidth-limited links; needs root, else localhost fallback).
# Extra arguments go to experiments/compare.py, e.g. `--bandwidth_mbit=50`.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${CROSSOVER_VENV:-$ROOT/.venv}
bash "$ROOT/scripts/install.sh"
cd "$ROOT"
exec "$VENV/bin/python" -m experiments.compare "$@"
