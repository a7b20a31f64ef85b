#!/usr/bin/env bash
# Builds and tests the op library with Bazel, offline, the way Bazel users would
# (ops/BUILD): Debian's bazel-bootstrap 4.2.3 builds //ops:_lease_ops.so against the installed
# TensorFlow (checked to hold no test hooks), the core's test-only targets and the GPU probe's
# CPU build, runs the lease core's cc_test (GoogleTest), and the built library is loaded in
# TensorFlow through CROSSOVER_LEASE_OPS to take and give back a lease.
#
# Why the extra set-up (docs: /work/shared/platform-notes.md's Bazel section):
# * Bazel 4.2.3's built-in WORKSPACE suffix fetches rules_cc, rules_java and
#   remote_coverage_tools over the network; offline, each is replaced with
#   --override_repository by a tiny local repository generated below (native rules wrapped).
# * It rejects `common --enable_workspace`, so configure.py writes a 4.2.3 rc file of its own
#   (--bazel4), used instead of the workspace .bazelrc (which stays for newer Bazel).
# * The cc_test chowns a segment to another uid, which Bazel's sandbox forbids: actions run
#   with --spawn_strategy=standalone.
# * The cc_test links the system's GoogleTest (ops/BUILD), which Bazel cannot fetch offline:
#   Debian's libgtest-dev, installed by scripts/apt_packages.sh where missing.
#
# Installs bazel-bootstrap with apt-get when missing (root only). Prints one "SKIPPED:" line and
# exits 0 where neither Bazel nor apt can provide it; GoogleTest missing after apt, or any build
# or test failure, exits non-zero.
#   bash scripts/bazel_check.sh
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${CROSSOVER_VENV:-$ROOT/.venv}
PY="$VENV/bin/python"
CACHE=${CROSSOVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/crossover_tf}
OVERRIDES="$CACHE/bazel4_overrides"   # fixed path: Bazel's caches stay valid across runs
APT_TIMEOUT_S=600
BAZEL_TIMEOUT_S=900

log() { printf '[bazel_check %(%H:%M:%S)T] %s\n' -1 "$*"; }
skip() { echo "SKIPPED: scripts/bazel_check.sh: $*"; exit 0; }
start=$(date +%s)

if ! command -v bazel >/dev/null; then
  command -v apt-get >/dev/null || skip "no bazel and no apt-get to install bazel-bootstrap"
  [ "$(id -u)" = 0 ] || skip "no bazel, and installing bazel-bootstrap with apt-get needs root"
  log "installing Debian's bazel-bootstrap"
  if ! timeout "$APT_TIMEOUT_S" apt-get install -y -q bazel-bootstrap >/dev/null 2>&1; then
    timeout "$APT_TIMEOUT_S" apt-get update -q >/dev/null 2>&1 || true
    timeout "$APT_TIMEOUT_S" apt-get install -y -q bazel-bootstrap >/dev/null 2>&1 \
      || skip "apt-get could not install bazel-bootstrap (offline, or no such package here)"
  fi
fi
[ -x "$PY" ] || { echo "no $PY: run scripts/install.sh first" >&2; exit 1; }
if [ ! -e /usr/include/gtest/gtest.h ]; then
  bash "$ROOT/scripts/apt_packages.sh"
  [ -e /usr/include/gtest/gtest.h ] || {
    echo "//ops:device_lease_test needs GoogleTest: Debian's libgtest-dev" \
      "(bash scripts/apt_packages.sh as root)" >&2
    exit 1
  }
fi

# --- the three override repositories (tiny, regenerated each run with the same content) ------
mkdir -p "$OVERRIDES"/rules_cc/cc "$OVERRIDES"/rules_java/java "$OVERRIDES"/remote_coverage_tools
for repo in rules_cc rules_java remote_coverage_tools; do
  echo "workspace(name = \"$repo\")" >"$OVERRIDES/$repo/WORKSPACE"
done
: >"$OVERRIDES/rules_cc/BUILD"; : >"$OVERRIDES/rules_cc/cc/BUILD"
: >"$OVERRIDES/rules_java/BUILD"; : >"$OVERRIDES/rules_java/java/BUILD"
wrappers() {  # one `def NAME(**attrs): native.NAME(**attrs)` per rule name
  echo "\"\"\"Offline stand-in for $1: the native rules of Bazel 4.2.3 (scripts/bazel_check.sh).\"\"\""
  shift
  for rule in "$@"; do printf '\ndef %s(**attrs):\n    native.%s(**attrs)\n' "$rule" "$rule"; done
}
wrappers rules_cc cc_binary cc_import cc_library cc_proto_library cc_test cc_toolchain \
  cc_toolchain_suite fdo_prefetch_hints fdo_profile objc_import objc_library \
  >"$OVERRIDES/rules_cc/cc/defs.bzl"
wrappers rules_java java_binary java_import java_library java_lite_proto_library \
  java_package_configuration java_plugin java_proto_library java_runtime java_test \
  java_toolchain >"$OVERRIDES/rules_java/java/defs.bzl"
cat >"$OVERRIDES/remote_coverage_tools/BUILD" <<'EOF'
# Offline stand-in: coverage is not collected here.
package(default_visibility = ["//visibility:public"])

filegroup(name = "coverage_report_generator")

filegroup(name = "lcov_merger")
EOF

# --- rc file: TensorFlow's paths and flags (configure.py) --------------------------------------
RC="$OVERRIDES/bazelrc"
TF_CPP_MIN_LOG_LEVEL=3 "$PY" "$ROOT/configure.py" --bazel4 --output "$RC" >"$RC.log" 2>&1 \
  || { cat "$RC.log" >&2; exit 1; }
# Sandboxed, Debian's linux-sandbox prints its debug trace for every action, and the test
# cannot chown (above): actions run unsandboxed.
echo "build --spawn_strategy=standalone --color=no --curses=no" >>"$RC"   # test inherits build
for repo in rules_cc rules_java remote_coverage_tools; do
  echo "build --override_repository=$repo=$OVERRIDES/$repo" >>"$RC"
done
BAZEL=(timeout "$BAZEL_TIMEOUT_S" bazel --noworkspace_rc --bazelrc="$RC")
cd "$ROOT"
# The server this script started (or reused) goes away with it: no idle JVM on shared cores.
trap 'timeout 120 bazel --noworkspace_rc --bazelrc="$RC" shutdown || true' EXIT

t0=$(date +%s)
# The shipped libraries, the core's test-only targets (testing/) and the GPU probe's CPU build.
TARGETS=(//ops:_lease_ops.so //ops:_lease_observer.so //ops:_bind_address.so
         //ops:device_lease_test //ops:lease_cli
         //ops:lease_cli_other_layout //ops:gpu_probe_cpu)
"${BAZEL[@]}" build "${TARGETS[@]}"
log "bazel build ${TARGETS[*]}: ok in $(( $(date +%s) - t0 )) s"
# The test hooks (testing/) stay out of the shipped libraries.
for lib in _lease_ops.so _lease_observer.so; do
  if nm -DC "bazel-bin/ops/$lib" | grep LeaseTestHooks >/dev/null; then
    echo "bazel-bin/ops/$lib exports LeaseTestHooks: testing/ must not be linked into it" >&2
    exit 1
  fi
done
t0=$(date +%s)
"${BAZEL[@]}" test --nocache_test_results --test_output=errors //ops:device_lease_test
# GoogleTest's closing lines: "[  PASSED  ] 32 tests." (and "[  SKIPPED ] N tests, ..." if any).
summary=$(grep -E '^\[  (PASSED|SKIPPED|FAILED)  \] [0-9]+ test' \
  bazel-testlogs/ops/device_lease_test/test.log | paste -sd ' ' - || true)
log "bazel test //ops:device_lease_test: ${summary:-no GoogleTest summary} in $(( $(date +%s) - t0 )) s"

LIB="$ROOT/bazel-bin/ops/_lease_ops.so"
CROSSOVER_LEASE_OPS="$LIB" CROSSOVER_LEASE_OBSERVER="$ROOT/bazel-bin/ops/_lease_observer.so" \
  TF_CPP_MIN_LOG_LEVEL=2 "$PY" - <<'PY'
import os, uuid
from crossover_tf import lease
from crossover_tf.node import observer
from crossover_tf.lease.segments import remove_group_segments

group = f"bazel{uuid.uuid4().hex[:8]}"
try:
    ops = lease.load_library()
    device = lease.DeviceLease(group, "cpu0", timeout_s=30)
    device.acquire()
    held = device.stats().held
    seen = observer.observe(device.path)
    device.yield_device()
    stats = device.stats()
    assert held and stats.acquires == 1 and not stats.held, stats
    assert seen.holder is not None and seen.holder.usage.acquires == 1, seen
    print(f"loaded {os.environ['CROSSOVER_LEASE_OPS']} in TensorFlow: took and gave back a "
          f"lease ({stats.acquires} acquire, held then {held}, now {stats.held}); "
          f"{os.environ['CROSSOVER_LEASE_OBSERVER']} saw the holder")
finally:
    remove_group_segments([group])
PY
log "done in $(( $(date +%s) - start )) s"
