#!/usr/bin/env bash
# Shift against crossing, measured (issue 50): on the emulated two-host cluster (needs root;
# without it add --bandwidth_mbit=N), job A calibrated to M/C = 1 and job B's batch calibrated
# so that T_B/T_A = 1, 1.5 and 2 (within ±10%, held across trials), each ratio runs 2
# interleaved trials of sequential, naive, shift (CASSINI's static shift) and crossover with
# link turns. Before each ratio's trials the planner predicts every scenario over naive from
# the calibration's solo runs; runs/shift/shift.md is the one table: measured over naive with
# its 95% interval and call, the prediction beside it, and whether they agreed.
# Budget: at most 60 minutes on 2 cores (install included: --budget_minutes=55 shortens every
# run to fit; the drift probe is off to save its 2 runs per ratio). Extra arguments go to
# experiments/compare.py (later flags win), e.g. adding crossover when the budget allows:
# `--scenarios=sequential,naive,shift,crossover,crossover_turn`.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/install.sh"
cd "$ROOT"
exec "${CROSSOVER_VENV:-$ROOT/.venv}/bin/python" -m experiments.compare \
    --sweep_period_ratio=1,1.5,2 --scenarios=sequential,naive,shift,crossover_turn \
    --trials=2 --budget_minutes=55 --nodrift_probe --out_dir=runs/shift "$@"
