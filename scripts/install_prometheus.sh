#!/usr/bin/env bash
# Installs Debian's Prometheus server (package `prometheus`: /usr/bin/prometheus and promtool)
# with apt, for the tests that scrape the lease exporter with a real Prometheus
# (tests/system/test_prometheus_server.py; fixture tests/support/prometheus_server.py) and for
# tests/unit/test_exporter_deploy.py's `promtool check rules` of the Grafana dashboard's queries.
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

NAME=install_prometheus
PACKAGES=(prometheus)
ENABLE_VAR=CROSSOVER_PROMETHEUS_INSTALL
NOT_ON_PATH="prometheus is not on PATH"
installed() { command -v prometheus >/dev/null; }
version() {
  echo "$(prometheus --version 2>&1 | head -n 1)$(command -v promtool >/dev/null && echo ', with promtool')"
}
# shellcheck source=scripts/apt_packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt_packages.sh"
apt_install_packages
