#!/usr/bin/env bash
# Installs Debian's Prometheus server (package `prometheus`: /usr/bin/prometheus and promtool)
# with apt, for the tests that scrape the lease exporter with a real Prometheus
# (tests/test_prometheus_server.py; fixture tests/prometheus_server.py) and for
# tests/test_exporter_deploy.py's `promtool check rules` of the Grafana dashboard's queries.
# scripts/test.sh calls it before pytest; CI runs it as root on a fresh machine.
#
# Idempotent and cached: does nothing when `prometheus` is already on PATH.
# Starts no daemon: a policy-rc.d keeps the package's init scripts from starting prometheus
# during the install (the test fixture starts and stops its own, by pid, as a plain process).
# Where apt cannot install it (not root, no apt-get, offline), prints one "SKIPPED:" line with the
# reason and exits 0: the Prometheus tests then skip and say why. CROSSOVER_PROMETHEUS_INSTALL=0
# skips it.
#   bash scripts/install_prometheus.sh
set -uo pipefail

APT_TIMEOUT_S=${CROSSOVER_APT_TIMEOUT_S:-600}
PACKAGES=(prometheus)

log() { printf '[install_prometheus %(%H:%M:%S)T] %s\n' -1 "$*"; }
skip() { echo "SKIPPED: scripts/install_prometheus.sh: $*"; exit 0; }

installed() { command -v prometheus >/dev/null; }
version() { prometheus --version 2>&1 | head -n 1; }

if installed; then
  log "Prometheus already installed ($(version))"
  exit 0
fi
[ "${CROSSOVER_PROMETHEUS_INSTALL:-1}" = 0 ] && skip "CROSSOVER_PROMETHEUS_INSTALL=0"
command -v apt-get >/dev/null || skip "no apt-get to install ${PACKAGES[*]}"
[ "$(id -u)" = 0 ] || skip "installing ${PACKAGES[*]} with apt-get needs root (uid $(id -u))"

# Keep the package's maintainer scripts from starting the daemon (exit 101: "action forbidden").
POLICY=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$POLICY" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$POLICY" && chmod 0755 "$POLICY" && made_policy=1
fi
cleanup() { [ "$made_policy" = 1 ] && rm -f "$POLICY"; }
trap cleanup EXIT

log "apt-get update"
out=$(timeout "$APT_TIMEOUT_S" apt-get update -q 2>&1) \
  || skip "apt-get update failed: $(tail -n 2 <<<"$out" | tr '\n' ' ')"
log "apt-get install ${PACKAGES[*]}"
out=$(DEBIAN_FRONTEND=noninteractive timeout "$APT_TIMEOUT_S" \
      apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" 2>&1) \
  || skip "apt-get install ${PACKAGES[*]} failed: $(tail -n 3 <<<"$out" | tr '\n' ' ')"
installed || skip "installed ${PACKAGES[*]}, but prometheus is not on PATH"
log "installed: $(version)$(command -v promtool >/dev/null && echo ', with promtool')"
