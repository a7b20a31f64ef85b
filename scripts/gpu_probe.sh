#!/usr/bin/env bash
# Measures, on this machine's GPU and without TensorFlow, what the planner's `gpu` model needs
# (README "Measuring your GPU"): two processes share one GPU, solo / naive co-location /
# crossover (the lease) / naive under MPS, M/C in {0.5, 1, 2} x host and device communication
# x 3 interleaved trials (about 5-6 minutes; bounded at 8). Needs an NVIDIA driver and nvcc
# (a CUDA 13 development image); no Python packages for the probe itself.
# Writes $GPU_PROBE_OUT (default runs/gpu_probe): gpu_probe.{json,md}, and, where the
# planner's Python (numpy) is importable, the gpu model's parameters gpu_params.{json,md}.
# Where there is no nvcc or no GPU it prints a SKIPPED line and exits 0.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

NVCC=${NVCC:-nvcc}
if ! command -v "$NVCC" >/dev/null 2>&1; then
  echo "gpu_probe: SKIPPED - no nvcc here ('$NVCC'; the probe is CUDA C++: use a CUDA development image)."
  exit 0
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "gpu_probe: SKIPPED - no NVIDIA GPU is visible here (nvidia-smi is missing or lists none)."
  exit 0
fi

OUT=${GPU_PROBE_OUT:-$ROOT/runs/gpu_probe}
mkdir -p "$OUT"
# One GPU: the first visible one unless told otherwise.
export CUDA_VISIBLE_DEVICES=${GPU_PROBE_DEVICE:-${CUDA_VISIBLE_DEVICES:-0}}
nvidia-smi -L | head -n 1
timeout 300 make -C ops gpu_probe NVCC="$NVCC"
# 72 sessions of about 4 s (0.5 s warm-up, 2.5 s window, process start) plus calibration.
timeout 480 ops/build/gpu_probe --procs=2 --compute_ms="${GPU_PROBE_COMPUTE_MS:-20}" \
  --ratios=0.5,1,2 --comm=host,device --modes=solo,naive,crossover,mps --trials=3 \
  --window_ms=2500 --warmup_ms=500 --out="$OUT/gpu_probe.json" --md="$OUT/gpu_probe.md"

PY=${CROSSOVER_PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3
if "$PY" -c 'import numpy' >/dev/null 2>&1; then
  timeout 120 "$PY" -m crossover_tf_planner.gpu_calibration "$OUT/gpu_probe.json" --out_dir="$OUT"
else
  echo "gpu_probe: no numpy for $PY; later, anywhere with the planner:"
  echo "  python -m crossover_tf_planner.gpu_calibration $OUT/gpu_probe.json --out_dir=$OUT"
fi
echo "gpu_probe: wrote $OUT/gpu_probe.{json,md}"
