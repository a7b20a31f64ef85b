# Sourced by scripts/install_slurm.sh and scripts/install_prometheus.sh: installs Debian packages
# with apt for the tests that run real components, the same way for each (run as a script, it
# installs GoogleTest for the lease core's C++ tests: the section at the end). The caller defines
# NAME (for its messages), PACKAGES (an array), ENABLE_VAR (an environment variable that skips
# the install when 0), installed() (true when already there), version() (one line) and
# NOT_ON_PATH (what to say when the install gave no command). Starts no daemon: a policy-rc.d
# keeps the packages' init scripts from starting any (the test fixtures start and stop their
# own, by pid). Where apt cannot install them (not root, no apt-get, offline), prints one
# "SKIPPED:" line with the reason and exits 0: the tests that need them then skip and say why.
APT_TIMEOUT_S=${CROSSOVER_APT_TIMEOUT_S:-600}

log() { printf '[%s %(%H:%M:%S)T] %s\n' "$NAME" -1 "$*"; }
skip() { echo "SKIPPED: scripts/$NAME.sh: $*"; exit 0; }

apt_install_packages() {
  if installed; then
    log "${PACKAGES[*]} already installed ($(version))"
    exit 0
  fi
  [ "${!ENABLE_VAR:-1}" = 0 ] && skip "$ENABLE_VAR=0"
  command -v apt-get >/dev/null || skip "no apt-get to install ${PACKAGES[*]}"
  [ "$(id -u)" = 0 ] || skip "installing ${PACKAGES[*]} with apt-get needs root (uid $(id -u))"
  # Keep the packages' maintainer scripts from starting daemons (exit 101: "action forbidden").
  local policy=/usr/sbin/policy-rc.d
  made_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 0755 "$policy" && made_policy=1
  fi
  trap '[ "$made_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d' EXIT
  log "apt-get update"
  local out
  out=$(timeout "$APT_TIMEOUT_S" apt-get update -q 2>&1) \
    || skip "apt-get update failed: $(tail -n 2 <<<"$out" | tr '\n' ' ')"
  log "apt-get install ${PACKAGES[*]}"
  out=$(DEBIAN_FRONTEND=noninteractive timeout "$APT_TIMEOUT_S" \
        apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" 2>&1) \
    || skip "apt-get install ${PACKAGES[*]} failed: $(tail -n 3 <<<"$out" | tr '\n' ' ')"
  installed || skip "installed ${PACKAGES[*]}, but $NOT_ON_PATH"
  log "installed: $(version)"
}

# Run as a script (not sourced): GoogleTest, Debian's libgtest-dev (headers in /usr/include/gtest,
# static libgtest.a and libgtest_main.a), which ops/testing/device_lease_test.cc is written with.
# ops/Makefile runs this where the compiler finds no <gtest/gtest.h>, and scripts/bazel_check.sh
# before Bazel builds //ops:device_lease_test; both stop, naming the package, if it still lacks.
#   bash scripts/apt_packages.sh
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -uo pipefail
  NAME=apt_packages
  PACKAGES=(libgtest-dev)
  ENABLE_VAR=CROSSOVER_GTEST_INSTALL
  NOT_ON_PATH="/usr/include/gtest/gtest.h or libgtest.a is missing"
  installed() {
    [ -e /usr/include/gtest/gtest.h ] && compgen -G '/usr/lib/*/libgtest.a' >/dev/null
  }
  version() {
    dpkg-query -W -f='libgtest-dev ${Version}' libgtest-dev 2>/dev/null || echo libgtest-dev
  }
  apt_install_packages
fi
