# Sourced by scripts/install_slurm.sh and scripts/install_prometheus.sh: installs Debian packages
# with apt for the tests that run real components, the same way for each. The caller defines
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
