"""An emulated cluster: N "hosts" as network namespaces on one bridge, each with a pinned CPU set.

Only 198.18.0.0/15 (benchmarking range) addresses are used, one free /24 per cluster
(`subnets.py`): hosts are .1..N, the bridge in the root namespace is .254 (where the launcher's
rendezvous servers listen). Without root or `ip netns` the cluster degrades to localhost "hosts"
without shaping and says so loudly.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import sys
from typing import Iterable, Sequence

from absl import logging

from experiments.cluster import cleanup, exit_hooks, naming, shaping, shell, subnets
from crossover_tf.lease import segments

LOCALHOST = "127.0.0.1"
MAX_HOSTS = 250
FORCE_LOCALHOST_ENV = "CROSSOVER_CLUSTER_FORCE_LOCALHOST"
CYCLE_TIME_ENV = "HOROVOD_CYCLE_TIME"
# Horovod's background thread coordinates the ranks every cycle, waiting or not. On an emulated
# host the "device" is the host's CPU, so a waiting job's polling is device time taken from the
# job computing there (on a GPU it is host CPU the device never sees): 0.142 CPU s per second
# of waiting at Horovod's 1 ms, 0.058 at 5 ms, 0.019 at 10 ms, with allreduces as long (612,
# 612, 616 ms for 1.1 MB at 16.42 Mbit/s; python -m experiments.probes --mode=calibrate
# --calibrate_cycle_time_ms=1|5|10, 2026-12-04). Every rank the cluster launches gets 10 ms
# unless the caller's environment sets HOROVOD_CYCLE_TIME.
DEFAULT_CYCLE_TIME_MS = 10.0
_PREFIX_ATTEMPTS = 26


@dataclasses.dataclass(frozen=True)
class Host:
    """One emulated host: its Horovod hostname, namespace (None on localhost), address, NIC,
    CPUs."""
    name: str
    namespace: str | None
    address: str
    iface: str
    cpus: str
    index: int


def default_cpus(num_hosts: int) -> list[str]:
    """Host i's "device" is CPU i modulo the CPUs this process may use."""
    allowed = sorted(os.sched_getaffinity(0))
    return [str(allowed[i % len(allowed)]) for i in range(num_hosts)]


def _warn_loudly(message: str) -> None:
    logging.warning(message)
    bar = "!" * 78
    print(f"\n{bar}\n!! crossover_tf cluster: {message}\n{bar}\n", file=sys.stderr, flush=True)


class EmulatedCluster:
    """Context manager owning the namespaces, veths and bridge of one cluster instance.

    Everything is removed in `close()`, which also runs on SIGINT/SIGTERM/SIGHUP and at exit.
    """

    def __init__(self, num_hosts: int = 2, bandwidth_mbit: float | None = None,
                 latency_ms: float = 0.0, cpus: Sequence[str] | None = None,
                 prefix: str | None = None, force_localhost: bool = False,
                 lease_groups: Iterable[str] = (),
                 horovod_cycle_time_ms: float | None = DEFAULT_CYCLE_TIME_MS):
        if not 1 <= num_hosts <= MAX_HOSTS:
            raise ValueError(f"num_hosts must be in 1..{MAX_HOSTS}, got {num_hosts}")
        if cpus is not None and len(cpus) != num_hosts:
            raise ValueError(f"cpus has {len(cpus)} entries for {num_hosts} hosts")
        if horovod_cycle_time_ms is not None and not horovod_cycle_time_ms > 0:
            raise ValueError(f"horovod_cycle_time_ms must be positive (None: Horovod's own), "
                             f"got {horovod_cycle_time_ms}")
        self.num_hosts = num_hosts
        self.link = shaping.LinkSpec(bandwidth_mbit, latency_ms)
        self.horovod_cycle_time_ms = horovod_cycle_time_ms
        self.cpus = list(cpus) if cpus is not None else default_cpus(num_hosts)
        self.lease_groups = [segments.validate_name("group", g, segments.GROUP_MAX_LEN)
                             for g in lease_groups]
        self._requested_prefix = prefix
        self._force_localhost = force_localhost or os.environ.get(FORCE_LOCALHOST_ENV) == "1"
        self.prefix: str | None = None
        self.subnet: subnets.Subnet | None = None
        self.hosts: list[Host] = []
        self.is_emulated = False
        self.fallback_reason = ""
        self.latency_applied = latency_ms <= 0
        self._hook: int | None = None
        self._pin = shutil.which("taskset") is not None

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> "EmulatedCluster":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def start(self) -> None:
        """Builds the cluster (or the localhost fallback); on any failure removes what it built."""
        self._hook = exit_hooks.register(self.close)
        usable, reason = (False, f"{FORCE_LOCALHOST_ENV}=1 / force_localhost") \
            if self._force_localhost else shell.netns_usable()
        if not usable:
            self._start_localhost(reason)
            return
        try:
            cleanup.cleanup_stale()
            self.prefix = self._claim_prefix()
            self._build()
            self.is_emulated = True
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Removes namespaces, veths, bridge and lease segments; safe to call more than once."""
        if self._hook is not None:
            exit_hooks.unregister(self._hook)
            self._hook = None
        if self.prefix is not None:
            leftovers = cleanup.remove_cluster_objects(self.prefix)
            logging.info("cluster %s removed: %s", self.prefix, leftovers)
            self.prefix = None
        self.subnet = None
        cleanup.remove_lease_segments(self.lease_groups)
        self.is_emulated = False

    # -- queries ---------------------------------------------------------------------------------
    @property
    def rendezvous_address(self) -> str:
        """Where ranks reach the launcher: the bridge address, or loopback in fallback mode."""
        return self.subnet.bridge_address if self.is_emulated else LOCALHOST

    def exec_prefix(self, host: Host) -> list[str]:
        """argv prefix that runs a command "on" `host`: inside its namespace, pinned to its CPUs."""
        prefix = ["ip", "netns", "exec", host.namespace] if host.namespace else []
        return prefix + (["taskset", "-c", host.cpus] if self._pin else [])

    def describe(self) -> dict:
        """A JSON-able summary for experiment results (what was really emulated)."""
        return {
            "emulated": self.is_emulated, "fallback_reason": self.fallback_reason,
            "num_hosts": self.num_hosts, "bandwidth_mbit": self.link.bandwidth_mbit,
            "latency_ms": self.link.latency_ms, "latency_applied": self.latency_applied,
            "subnet": str(self.subnet.network) if self.subnet else None,
            "hosts": [dataclasses.asdict(h) for h in self.hosts],
            "horovod_cycle_time_ms": self.cycle_time_ms(),
        }

    def rank_defaults(self) -> dict[str, str]:
        """Environment every rank gets unless the caller's sets it (DEFAULT_CYCLE_TIME_MS)."""
        if self.horovod_cycle_time_ms is None:
            return {}
        return {CYCLE_TIME_ENV: f"{self.horovod_cycle_time_ms:g}"}

    def cycle_time_ms(self) -> float | None:
        """The HOROVOD_CYCLE_TIME the ranks run with (None: Horovod's own, 1 ms)."""
        value = os.environ.get(CYCLE_TIME_ENV) or self.rank_defaults().get(CYCLE_TIME_ENV)
        try:
            return None if value is None else float(value)
        except ValueError:
            return None

    # -- building --------------------------------------------------------------------------------
    def _start_localhost(self, reason: str) -> None:
        self.fallback_reason = reason
        self.latency_applied = self.link.latency_ms <= 0
        self.hosts = [Host(f"host{i}", None, LOCALHOST, "lo", self.cpus[i], i)
                      for i in range(self.num_hosts)]
        _warn_loudly(f"NOT EMULATING A NETWORK ({reason}): {self.num_hosts} localhost ranks, "
                     "no namespaces, NO bandwidth/latency limits")

    def _claim_prefix(self) -> str:
        """Picks an unused prefix and records this process as its owner before creating anything."""
        in_use = {naming.owner_of(n) for n in cleanup.list_links() + cleanup.list_namespaces()}
        for _ in range(_PREFIX_ATTEMPTS):
            prefix = self._requested_prefix or naming.next_prefix()
            if prefix not in in_use and not cleanup.owner_alive(prefix):
                naming.bridge_veth(prefix, self.num_hosts - 1)  # fails early if names too long
                cleanup.record_owner(prefix)
                return prefix
            if self._requested_prefix:
                break
        raise RuntimeError(f"no free cluster prefix (tried {self._requested_prefix or 'xo<pid>*'})")

    def _build(self) -> None:
        bridge = naming.bridge_name(self.prefix)
        shell.run(["ip", "link", "add", bridge, "type", "bridge"])
        self.subnet = subnets.assign_bridge(bridge)
        shell.run(["ip", "link", "set", bridge, "up"])
        latency_ok = []
        for i in range(self.num_hosts):
            host = self._build_host(i, bridge)
            latency_ok.append(shaping.apply(naming.bridge_veth(self.prefix, i), self.link))
            latency_ok.append(shaping.apply(host.iface, self.link, netns=host.namespace))
            self.hosts.append(host)
        self.latency_applied = all(latency_ok)
        if not self.latency_applied:
            _warn_loudly(f"latency_ms={self.link.latency_ms} requested but NOT applied "
                         "(no sch_netem in this kernel); only bandwidth is emulated")

    def _build_host(self, i: int, bridge: str) -> Host:
        ns = naming.namespace(self.prefix, i)
        outer, inner = naming.bridge_veth(self.prefix, i), naming.host_veth(self.prefix, i)
        address = self.subnet.host_address(i)
        shell.run(["ip", "netns", "add", ns])
        shell.run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
        shell.run(["ip", "link", "set", inner, "netns", ns])
        in_ns = ["ip", "-n", ns]
        shell.run(in_ns + ["link", "set", inner, "name", naming.NS_IFACE])
        shell.run(in_ns + ["addr", "add", f"{address}/{subnets.PREFIXLEN}", "dev", naming.NS_IFACE])
        shell.run(in_ns + ["link", "set", naming.NS_IFACE, "up"])
        shell.run(in_ns + ["link", "set", "lo", "up"])
        shell.run(["ip", "link", "set", outer, "master", bridge, "up"])
        _write_hosts_file(ns, address)
        return Host(f"host{i}", ns, address, naming.NS_IFACE, self.cpus[i], i)


def _write_hosts_file(ns: str, address: str) -> None:
    """Makes the machine's hostname resolve to the namespace's own address inside it.

    Horovod 0.28.1 creates the Gloo device of its process-set contexts without HOROVOD_GLOO_IFACE
    (GlooContext::InitializeForProcessSet never copies the iface), so Gloo falls back to resolving
    gethostname(); with the shared /etc/hosts that is 127.0.0.1, unreachable from the other hosts.
    `ip netns exec` bind-mounts /etc/netns/<ns>/hosts over /etc/hosts, which fixes that per host.
    """
    etc = naming.netns_etc_dir(ns)
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n{address}\t{socket.gethostname()}\n")
