"""Removal of what launchers leave behind: namespaces/links of dead launchers, lease segments.

Each cluster records its owner (pid + process start time, so a recycled pid does not count as
alive) before creating anything; `cleanup_stale` removes every prefixed object whose owner is gone.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
from typing import Iterable

from absl import logging

from experiments.cluster import naming, shell
from crossover_tf.lease import segments

OWNER_DIR = pathlib.Path(tempfile.gettempdir()) / "crossover_tf_clusters"
_MAX_OBJECTS = 1000  # bound on how many leftovers one sweep touches


def _process_start_time(pid: int) -> str | None:
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22 (starttime), counted after "comm)"


def record_owner(prefix: str) -> None:
    """Marks `prefix` as owned by this live process (written before anything is created)."""
    OWNER_DIR.mkdir(parents=True, exist_ok=True)
    owner = {"pid": os.getpid(), "start": _process_start_time(os.getpid())}
    (OWNER_DIR / f"{prefix}.json").write_text(json.dumps(owner))


def forget_owner(prefix: str) -> None:
    (OWNER_DIR / f"{prefix}.json").unlink(missing_ok=True)


def owner_alive(prefix: str) -> bool:
    """Whether the process that created `prefix` still runs (unknown owner counts as dead)."""
    try:
        owner = json.loads((OWNER_DIR / f"{prefix}.json").read_text())
    except (OSError, ValueError):
        return False
    return _process_start_time(int(owner["pid"])) == owner.get("start")


def list_namespaces() -> list[str]:
    out = shell.run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def list_links() -> list[str]:
    """Names of links in the root namespace (without the `@peer` suffix)."""
    out = shell.run(["ip", "-o", "link", "show"], check=False).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def list_netns_etc_dirs() -> list[pathlib.Path]:
    """Entries of /etc/netns (per-namespace config of any namespace, ours or not)."""
    root = naming.NETNS_ETC_ROOT
    return list(root.iterdir())[:_MAX_OBJECTS] if root.is_dir() else []


def remove_cluster_objects(prefix: str) -> list[str]:
    """Deletes every link, namespace and /etc/netns entry named with `prefix`; returns them."""
    removed = []
    # Links first: deleting a root-side veth destroys its peer at once, while a deleted namespace
    # releases its interfaces asynchronously (they would linger for a moment after `netns del`).
    for link in list_links()[:_MAX_OBJECTS]:
        if naming.owner_of(link) == prefix and shell.run_quietly(["ip", "link", "del", link]):
            removed.append(link)
    for ns in list_namespaces()[:_MAX_OBJECTS]:
        if naming.owner_of(ns) == prefix and shell.run_quietly(["ip", "netns", "del", ns]):
            removed.append(ns)
    for etc in list_netns_etc_dirs():
        if naming.owner_of(etc.name) == prefix:
            shutil.rmtree(etc, ignore_errors=True)
            removed.append(str(etc))
    forget_owner(prefix)
    return removed


def cleanup_stale() -> list[str]:
    """Removes namespaces/links/owner records of launchers that are no longer running."""
    names = list_namespaces() + list_links() + [p.name for p in list_netns_etc_dirs()]
    prefixes = {naming.owner_of(n) for n in names} - {None}
    if OWNER_DIR.is_dir():
        prefixes |= {p.stem for p in list(OWNER_DIR.glob("xo*.json"))[:_MAX_OBJECTS]}
    removed = []
    for prefix in sorted(prefixes)[:_MAX_OBJECTS]:
        if not owner_alive(prefix):
            removed += remove_cluster_objects(prefix)
    if removed:
        logging.warning("cleanup_stale removed leftovers of dead launchers: %s", removed)
    return removed


def remove_lease_segments(groups: Iterable[str]) -> list[str]:
    """Unlinks /dev/shm/crossover.<group>.* for each lease group (names validated first)."""
    return segments.remove_group_segments(groups)
