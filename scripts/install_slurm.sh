#!/usr/bin/env bash
# Installs Debian's Slurm (slurm-wlm: slurmctld, slurmd, sbatch/srun) and munge with apt, for the
# real one-node Slurm tests (tests/test_deploy_slurm.py; fixture tests/slurm_cluster.py).
# scripts/test.sh calls it before pytest; CI runs it as root on a fresh machine.
#
# Idempotent and cached: does nothing when slurmctld, slurmd, sbatch and munged are already there.
# Starts no daemon: a policy-rc.d keeps the packages' init scripts from starting munged or slurm
# during the install (the test fixture starts and stops its own, by pid).
# Where apt cannot install them (not root, no apt-get, offline), prints one "SKIPPED:" line with the
# reason and exits 0: the Slurm tests then skip and say why.
#   bash scripts/install_slurm.sh
set -uo pipefail

APT_TIMEOUT_S=${CROSSOVER_APT_TIMEOUT_S:-600}
PACKAGES=(slurm-wlm munge)

log() { printf '[install_slurm %(%H:%M:%S)T] %s\n' -1 "$*"; }
skip() { echo "SKIPPED: scripts/install_slurm.sh: $*"; exit 0; }

installed() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
    && command -v sbatch >/dev/null && command -v munged >/dev/null
}

if installed; then
  log "Slurm and munge already installed ($(slurmctld -V 2>/dev/null || echo slurmctld))"
  exit 0
fi
[ "${CROSSOVER_SLURM_INSTALL:-1}" = 0 ] && skip "CROSSOVER_SLURM_INSTALL=0"
command -v apt-get >/dev/null || skip "no apt-get to install ${PACKAGES[*]}"
[ "$(id -u)" = 0 ] || skip "installing ${PACKAGES[*]} with apt-get needs root (uid $(id -u))"

# Keep the packages' maintainer scripts from starting daemons (exit 101: "action forbidden").
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
installed || skip "installed ${PACKAGES[*]}, but slurmctld/slurmd/sbatch/munged are not on PATH"
log "installed: $(slurmctld -V 2>/dev/null), $(munged -V 2>/dev/null | head -n 1)"
