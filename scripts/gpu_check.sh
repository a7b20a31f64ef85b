#!/usr/bin/env bash
# One check of a GPU machine, for someone who has one (about 5-8 minutes on one GPU):
#   1. install for GPUs (CROSSOVER_TF_EXTRA=gpu; cached after the first time);
#   2. the lease ops on the GPU: device tensors pass through, the yield waits for the compute
#      stream, an eager release needs no stream (pytest -m needs_gpu);
#   3. two crossed jobs on one GPU (one Horovod rank each, ResNet-20 on synthetic
#      CIFAR-10) next to solo and naive co-location: throughput and peak GPU memory per job,
#      printed as a markdown table and written to runs/gpu_check/gpu_pair.{md,json}.
# On a machine without an NVIDIA GPU it says so and exits 0: there is nothing to check.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "gpu_check: SKIPPED - no NVIDIA GPU is visible here (nvidia-smi is missing or lists none)."
  echo "gpu_check: run this script on a machine with a GPU; CPU machines use scripts/test.sh."
  exit 0
fi
nvidia-smi -L

VENV=${CROSSOVER_VENV:-$ROOT/.venv}
STEPS=${GPU_CHECK_STEPS:-60}
CROSSOVER_TF_EXTRA=gpu bash scripts/install.sh
timeout 600 "$VENV/bin/python" -m pytest -m needs_gpu -q tests
timeout 900 "$VENV/bin/python" -m experiments.gpu_pair --steps="$STEPS" \
  --model_dir=runs/gpu_check
