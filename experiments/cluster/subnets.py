"""Which /24 of the benchmarking range 198.18.0.0/15 one emulated cluster uses.

Two clusters on one machine with the same subnet put two routes to it in the root namespace:
the launcher's replies to the second cluster's hosts then left by the first cluster's bridge, so
the second cluster's Gloo rendezvous never answered and its jobs hung until their timeout. Each
cluster therefore takes a /24 that no root-namespace address or route overlaps, and puts its bridge
address on while holding a machine-wide lock, so two launchers starting at once cannot pick the
same one.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import ipaddress
import re
from typing import Iterable, Iterator

from crossover_tf.lease.file_lock import flock_within
from experiments.cluster import cleanup, shell

BENCHMARK_NET = ipaddress.ip_network("198.18.0.0/15")
PREFIXLEN = 24
BRIDGE_HOST = 254  # the root namespace's address in every cluster subnet
LOCK_PATH = cleanup.OWNER_DIR / "subnets.lock"
LOCK_TIMEOUT_S = 30.0
_LOCK_POLL_S = 0.05
_INET_RE = re.compile(r"\binet\s+(\d+\.\d+\.\d+\.\d+/\d+)")
_ROUTE_RE = re.compile(r"^(?:\S+\s+)?(\d+\.\d+\.\d+\.\d+(?:/\d+)?)\s", re.M)


@dataclasses.dataclass(frozen=True)
class Subnet:
    """One cluster's /24: hosts are .1 .. .N, the bridge (the launcher's side) is .254."""
    network: ipaddress.IPv4Network

    @property
    def bridge_address(self) -> str:
        return str(self.network[BRIDGE_HOST])

    def host_address(self, index: int) -> str:
        if not 0 <= index < BRIDGE_HOST - 1:
            raise ValueError(f"host index {index} out of range for a /{PREFIXLEN}")
        return str(self.network[index + 1])


def networks_in_use() -> list[ipaddress.IPv4Network]:
    """Networks of the root namespace's IPv4 addresses and routes (any table), whoever made them."""
    found = []
    addrs = shell.run(["ip", "-o", "-4", "addr", "show"]).stdout
    found += [ipaddress.ip_interface(a).network for a in _INET_RE.findall(addrs)]
    routes = shell.run(["ip", "-4", "route", "show", "table", "all"]).stdout
    found += [ipaddress.ip_network(r, strict=False) for r in _ROUTE_RE.findall(routes)]
    return found


def first_free(in_use: Iterable[ipaddress.IPv4Network]) -> Subnet:
    """The lowest /24 of 198.18.0.0/15 that overlaps nothing in `in_use`."""
    taken = [n for n in in_use if n.overlaps(BENCHMARK_NET)]
    for network in BENCHMARK_NET.subnets(new_prefix=PREFIXLEN):
        if not any(network.overlaps(t) for t in taken):
            return Subnet(network)
    raise RuntimeError(
        f"every /{PREFIXLEN} of {BENCHMARK_NET} is in use on this machine "
        f"({len(taken)} networks there): remove stale clusters (`ip netns list`, bridges named "
        "xo*br) or other users of the benchmarking range, then start again")


@contextlib.contextmanager
def claim_lock(timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Holds the machine-wide subnet lock; a clear error, not a hang, if another launcher keeps
    it."""
    LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK_PATH, "a") as lock:
        if not flock_within(lock, timeout_s, _LOCK_POLL_S):
            raise RuntimeError(f"another cluster launcher held {LOCK_PATH} for over "
                               f"{timeout_s:.0f} s while choosing its subnet")
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def assign_bridge(bridge: str) -> Subnet:
    """Picks a free subnet and puts its .254 on `bridge`, as one step under the lock."""
    with claim_lock():
        subnet = first_free(networks_in_use())
        shell.run(["ip", "addr", "add", f"{subnet.bridge_address}/{PREFIXLEN}", "dev", bridge])
    return subnet
