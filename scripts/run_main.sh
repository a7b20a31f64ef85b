#!/usr/bin/env bash
# The project's main job (README): install (cached), then run the side-by-side comparison of a
# crossover pair against solo, sequential and naive co-location on an emulated two-host
# cluster (network namespaces, bandwidth-limited links; needs root: without it, add
# --bandwidth_mbit=N to run unshaped localhost ranks, uncalibrated).
# It calibrates the link to M/C = 1 and runs 4 interleaved trials of sequential, naive,
# crossover and crossover with link turns (crossover_turn): 4 trials of 4 scenarios make a
# Williams square, in which each scenario runs in every position once. After calibration it
# prints its estimated length and shortens every run to fit --budget_minutes=38 (the install
# adds about 2 minutes on a cached machine); a trial that drifts out of the regime re-shapes the
# link for the next, and a drift probe runs before and after the trials. Extra arguments go to
# experiments/compare.py (later flags win), e.g. `--comm_to_compute=2`, `--trials=5`,
# `--sweep_comm_to_compute=0.5,1,2` or `--bandwidth_mbit=50` (fixed link, no calibration).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${CROSSOVER_VENV:-$ROOT/.venv}
bash "$ROOT/scripts/install.sh"
cd "$ROOT"
exec "$VENV/bin/python" -m experiments.compare --trials=4 --budget_minutes=38 \
    --scenarios=sequential,naive,crossover,crossover_turn "$@"
