#!/usr/bin/env bash
# Installs crossover_tf into a virtual environment, idempotently.
#
# Why a script: Horovod 0.28.1 has no wheel for TF 2.21 and must be built from its sdist against
# the installed TensorFlow (minutes on 2 cores). We build it once and keep the wheel in a cache
# outside the repo, keyed by Horovod + TF + Python versions, so CI and later runs reuse it.
#
# Environment knobs:
#   CROSSOVER_VENV        venv path              (default: <repo>/.venv)
#   CROSSOVER_CACHE       wheel cache directory  (default: ~/.cache/crossover_tf)
#   CROSSOVER_TF_EXTRA    cpu | gpu              (default: cpu -> tensorflow-cpu; gpu -> tensorflow
#                                                 with its CUDA libraries, and Horovod with NCCL
#                                                 when a CUDA toolkit and NCCL are found)
#   PYTHON                base interpreter       (default: python3.11)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${CROSSOVER_VENV:-$ROOT/.venv}
CACHE=${CROSSOVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/crossover_tf}
EXTRA=${CROSSOVER_TF_EXTRA:-cpu}
BASE_PY=${PYTHON:-python3.11}
export PIP_DISABLE_PIP_VERSION_CHECK=1

log() { printf '[install %(%H:%M:%S)T] %s\n' -1 "$*"; }
start=$(date +%s)

case "$EXTRA" in
  cpu) TF_NAME=tensorflow-cpu ;;
  gpu) TF_NAME=tensorflow ;;
  *) echo "CROSSOVER_TF_EXTRA must be cpu or gpu, got '$EXTRA'" >&2; exit 2 ;;
esac

if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv $VENV"
  "$BASE_PY" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip -q)
pin() { "$PY" "$ROOT/scripts/pins.py" "$@"; }

TF_REQ=$(pin "$TF_NAME")
# GPU: TensorFlow's pip CUDA libraries (cuDNN, NCCL, ...) come with its and-cuda extra.
[ "$EXTRA" = gpu ] && TF_REQ=${TF_REQ/tensorflow==/tensorflow[and-cuda]==}
HVD_REQ=$(pin horovod)
log "dependencies: $TF_REQ, $HVD_REQ"
# Everything except Horovod first: Horovod's build needs TensorFlow importable.
"${PIP[@]}" install "$TF_REQ" $(pin keras tensorflow-datasets absl-py tensorboard matplotlib networkx prometheus-client pyyaml bcrypt pytest ruff) wheel "setuptools>=77"

# The tests' fit reference (pyproject.toml's test extra says why); --no-deps: it names `tensorflow`.
"${PIP[@]}" install --no-deps "$(pin tf-keras)"

HVD_VERSION=${HVD_REQ#horovod==}
TF_VERSION=$("$PY" -c 'import importlib.metadata as m; print(m.version("'"$TF_NAME"'"))')
PY_TAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
# Horovod's GPU collectives: NCCL when building for GPUs and both a CUDA toolkit (nvcc) and
# NCCL (headers + library: $HOROVOD_NCCL_HOME, or the nvidia-nccl wheel TF's and-cuda brings)
# exist; otherwise Gloo alone, which reduces GPU tensors through host memory.
GPU_OPS=
if [ "$EXTRA" = gpu ]; then
  NCCL_HOME=${HOROVOD_NCCL_HOME:-$("$PY" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)}
  if command -v nvcc >/dev/null && [ -n "$NCCL_HOME" ] && [ -e "$NCCL_HOME/include/nccl.h" ]; then
    GPU_OPS=NCCL
    export HOROVOD_NCCL_HOME=$NCCL_HOME HOROVOD_CUDA_HOME=${HOROVOD_CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
    log "GPU build: Horovod with NCCL from $HOROVOD_NCCL_HOME and CUDA from $HOROVOD_CUDA_HOME"
  else
    log "GPU build without nvcc or NCCL headers: Horovod gets Gloo only (allreduce via host memory)"
  fi
fi
WHEEL_DIR="$CACHE/wheels/horovod-$HVD_VERSION-$TF_NAME-$TF_VERSION-$PY_TAG${GPU_OPS:+-nccl}"

hvd_ok() {
  "$PY" - <<'PY' 2>/dev/null
import importlib.metadata as m, sys
import horovod.tensorflow as hvd
sys.exit(0 if hvd.gloo_built() and m.version("horovod") else 1)
PY
}

if hvd_ok && [ "$("$PY" -c 'import importlib.metadata as m; print(m.version("horovod"))')" = "$HVD_VERSION" ]; then
  log "horovod $HVD_VERSION already installed with Gloo"
else
  # A wheel found there is installed and run: the cache must be root's or this user's and
  # nobody else's to write (the op cache's trust rule, crossover_tf/lease/trusted_path.py).
  PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m crossover_tf.lease.trusted_path "$WHEEL_DIR"
  if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    log "building horovod $HVD_VERSION against $TF_NAME $TF_VERSION (cached in $WHEEL_DIR)"
    src=$(mktemp -d)
    trap 'rm -rf "$src"' EXIT
    "${PIP[@]}" download --no-deps --no-binary :all: "$HVD_REQ" -d "$src"
    tar -xzf "$src"/horovod-"$HVD_VERSION".tar.gz -C "$src"
    # xla_mpi_ops.cc needs highwayhash/farmhash headers the TF wheel does not ship; Horovod's
    # XLA path is MPI-only, which we do not build, so the file is safe to leave out.
    sed -i '/xla_mpi_ops.cc/d' "$src/horovod-$HVD_VERSION/horovod/tensorflow/CMakeLists.txt"
    CMAKE_BIN=$(command -v cmake || true)
    if [ -z "$CMAKE_BIN" ]; then
      "${PIP[@]}" install 'cmake>=3.13,<4'
      CMAKE_BIN="$VENV/bin/cmake"
    fi
    mkdir -p "$WHEEL_DIR.tmp"
    HOROVOD_CMAKE="$CMAKE_BIN" HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 \
      HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
      HOROVOD_GPU_OPERATIONS=$GPU_OPS MAKEFLAGS="-j$(nproc)" \
      "${PIP[@]}" wheel --no-build-isolation --no-deps "$src/horovod-$HVD_VERSION" -w "$WHEEL_DIR.tmp"
    rm -rf "$WHEEL_DIR" && mv "$WHEEL_DIR.tmp" "$WHEEL_DIR"   # publish atomically
  else
    log "reusing cached wheel $WHEEL_DIR"
  fi
  "${PIP[@]}" install --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl
  # Horovod's own runtime deps (cloudpickle, psutil, pyyaml, packaging, cffi).
  "${PIP[@]}" install cloudpickle psutil pyyaml packaging cffi
  hvd_ok || { echo "horovod.tensorflow does not import or lacks Gloo" >&2; exit 1; }
fi

log "building the device-lease op library"
make -s -C "$ROOT/ops" PYTHON="$PY"

log "installing crossover_tf (editable)"
"${PIP[@]}" install --no-build-isolation --no-deps -e "$ROOT"

"$PY" - <<'PY'
import horovod.tensorflow as hvd
import crossover_tf.lease as lease
assert hvd.gloo_built(), "Horovod built without Gloo"
lease.load_library()
import importlib.metadata as md
print("horovod", md.version("horovod"), "gloo", hvd.gloo_built(), "| lease ops loaded")
PY
log "done in $(( $(date +%s) - start )) s"
