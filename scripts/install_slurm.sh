#!/usr/bin/env bash
# Installs Debian's Slurm (slurm-wlm: slurmctld, slurmd, sbatch/srun) and munge with apt, for the
# real one-node Slurm tests (tests/system/test_deploy_slurm.py; fixture tests/support/slurm_cluster.py),
# and nftables, whose `nft` loads the Slurm prolog's port fence (deploy/slurm/crossover_tf_ports.sh;
# tests/system/test_deploy_slurm_ports.py).
# scripts/test.sh calls it before pytest; CI runs it as root on a fresh machine.
#
# Idempotent and cached: does nothing when slurmctld, slurmd, sbatch and munged are already there.
# Starts no daemon: a policy-rc.d keeps the packages' init scripts from starting munged or slurm
# during the install (the test fixture starts and stops its own, by pid).
# Where apt cannot install them (not root, no apt-get, offline), prints one "SKIPPED:" line with the
# reason and exits 0: the Slurm tests then skip and say why.
#   bash scripts/install_slurm.sh
set -uo pipefail

NAME=install_slurm
PACKAGES=(slurm-wlm munge nftables)
ENABLE_VAR=CROSSOVER_SLURM_INSTALL
NOT_ON_PATH="slurmctld/slurmd/sbatch/munged/nft are not on PATH"
installed() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
    && command -v sbatch >/dev/null && command -v munged >/dev/null && command -v nft >/dev/null
}
version() { echo "$(slurmctld -V 2>/dev/null), $(munged -V 2>/dev/null | head -n 1)"; }
# shellcheck source=scripts/apt_packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt_packages.sh"
apt_install_packages
