"""Names of everything one cluster instance creates, all under one per-instance prefix.

The prefix (`xo<pid % 10000><letter>`) keeps concurrent launchers apart and lets `cleanup_stale`
find leftovers; interface names stay within Linux's 15-character limit.
"""
from __future__ import annotations

import itertools
import os
import pathlib
import re
import string

MAX_IFNAME = 15
PREFIX_RE = re.compile(r"^(xo\d{1,4}[a-z])(?:br|v\d+|p\d+|h\d+)$")
NETNS_ETC_ROOT = pathlib.Path("/etc/netns")
NS_IFACE = "eth0"  # every host sees the same interface name, so HOROVOD_GLOO_IFACE is uniform

_letters = itertools.cycle(string.ascii_lowercase)


def next_prefix() -> str:
    """A fresh prefix for this process; callers skip ones still in use (see netns.py)."""
    return f"xo{os.getpid() % 10000}{next(_letters)}"


def bridge_name(prefix: str) -> str:
    return _checked(f"{prefix}br")


def bridge_veth(prefix: str, index: int) -> str:
    """Root-namespace end of host `index`'s veth, enslaved to the bridge."""
    return _checked(f"{prefix}v{index}")


def host_veth(prefix: str, index: int) -> str:
    """Host end before it moves into the namespace and is renamed to NS_IFACE."""
    return _checked(f"{prefix}p{index}")


def namespace(prefix: str, index: int) -> str:
    return f"{prefix}h{index}"


def netns_etc_dir(ns: str) -> pathlib.Path:
    """Per-namespace /etc overrides that `ip netns exec` bind-mounts (see
    netns._write_hosts_file)."""
    return NETNS_ETC_ROOT / ns


def owner_of(name: str) -> str | None:
    """The prefix a link or namespace name belongs to, or None if the launcher did not make it."""
    match = PREFIX_RE.match(name)
    return match.group(1) if match else None


def _checked(ifname: str) -> str:
    if len(ifname) > MAX_IFNAME:
        raise ValueError(f"interface name {ifname!r} longer than {MAX_IFNAME} characters")
    return ifname
