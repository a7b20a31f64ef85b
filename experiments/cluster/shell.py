"""Bounded wrappers around `ip`/`tc`: every external command gets a timeout so no loop can hang."""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import Sequence

from absl import logging

COMMAND_TIMEOUT_S = 10.0


class CommandError(RuntimeError):
    """An `ip`/`tc` command failed; carries its stderr so the reason is visible."""


def run(argv: Sequence[str], *, check: bool = True, timeout_s: float = COMMAND_TIMEOUT_S,
        stdin: str | None = None) -> subprocess.CompletedProcess:
    """Runs one command with a hard timeout; raises CommandError on failure when `check`."""
    try:
        proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                              timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        if check:
            raise CommandError(f"{' '.join(argv)}: {exc}") from exc
        logging.debug("ignored failure of %s: %s", argv, exc)
        return subprocess.CompletedProcess(list(argv), -1, "", str(exc))
    if check and proc.returncode != 0:
        raise CommandError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def run_quietly(argv: Sequence[str]) -> bool:
    """Runs a best-effort teardown command; True when it succeeded (failures only logged)."""
    return run(argv, check=False).returncode == 0


def netns_usable() -> tuple[bool, str]:
    """Whether this process can create network namespaces, and if not, why (for the warning)."""
    if os.geteuid() != 0:
        return False, "not running as root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` is not installed"
    probe = run(["ip", "netns", "list"], check=False)
    if probe.returncode != 0:
        return False, f"`ip netns` unusable: {probe.stderr.strip()}"
    return True, ""
