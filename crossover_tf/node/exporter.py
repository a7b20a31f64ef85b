"""`python -m crossover_tf.lease exporter`: a node exporter for Prometheus that shows who used
each device of the node's leases.

Runs once per node (a Kubernetes DaemonSet, a Slurm node service) and needs nothing from the
jobs: each scrape reads every lease in the directory as `status` does (observer.py: read-only,
non-blocking, the trust rule checked; never joins, creates, repairs or blocks), bounded as a
whole, and turns each member's counters in the segment into metrics (exporter_metrics.py names
them). No TensorFlow: the exporter imports neither it nor Horovod, and never touches a GPU.

A member's counters live in its slot while it lives; when a process exits its series end, and
what it did after the last scrape is lost (at most one scrape interval of it). A restarted job
starts new series (a new pid): `increase()` and `rate()` sum them correctly.

Planted files cannot swamp a scrape: the time bound covers listing the directory as well as
reading it, names that fail the trust rule are counted apart and never read, and member series
stop at MAX_MEMBERS_PER_LEASE per lease and MAX_MEMBERS_PER_SCRAPE in all, the rest counted
(exporter_metrics.py). One scrape of 1,000 forged leases of 63 live members each took 13.6 s
for 1,138,004 samples before the bound, 0.40 s for 13,222 with it
(benchmarks/exporter_scrape.py).

Who may read the metrics (job names, pids, pid namespaces and device keys of every lease on
the node): serve() listens where cli.py allows (loopback by default) with the TLS and basic
auth of --web.config.file, in the Prometheus exporters' format (web_config.py), bounded against
hostile clients there; the file is re-read when it changes, and on SIGHUP.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Iterator, Sequence

from prometheus_client import make_wsgi_app
from prometheus_client.core import (REGISTRY, CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, Metric)
from prometheus_client.registry import Collector

from crossover_tf.node import exporter_metrics as names
from crossover_tf.node.exporter_metrics import MAX_MEMBERS_PER_LEASE, MAX_MEMBERS_PER_SCRAPE
from crossover_tf.node.directory_reader import read_directory
from crossover_tf.node.observer import (OBSERVE_BOUND_S, LeaseReadError, Observation,
                                         check_library, observe)
from crossover_tf.node.web_config import WebConfig, WSGIServer, start_server
from crossover_tf.lease.segments import LeaseDirError, resolve_lease_dir

DEFAULT_PORT = 9469
SCRAPE_BOUND_S = 5.0  # one scrape, however many files the directory holds


def _families() -> dict[str, Metric]:
    kinds = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily,
             "histogram": HistogramMetricFamily}
    return {m.name: kinds[m.kind](m.name, m.help, labels=list(m.labels)) for m in names.METRICS}


def _cumulative(buckets: Sequence[int], upper_s: Sequence[float]) -> list[tuple[str, float]]:
    """prometheus_client's histogram buckets: cumulative counts by upper bound, then +Inf."""
    total, out = 0, []
    for count, bound in zip(buckets, [*upper_s, float("inf")]):
        total += count
        out.append(("+Inf" if bound == float("inf") else repr(bound), float(total)))
    return out


def add_lease(families: dict[str, Metric], group: str, device: str, lease: Observation,
              max_members: int = MAX_MEMBERS_PER_LEASE) -> int:
    """Adds one lease's samples to the families: the lease's own, and the member series of its
    first max_members members (the observation's order: the holder first). Returns how many
    members got series."""
    def add(name: str, labels: list[str], value: float) -> None:
        families[names.PREFIX + name].add_metric(labels, value)

    lease_labels = [group, device]
    add("members", lease_labels, lease.member_count)
    add("queue_length", lease_labels, len(lease.queue))
    add("overlapping_holds_total", lease_labels, lease.overlapping_holds)
    add("recoveries_total", lease_labels, lease.recoveries)
    if lease.holder is not None:
        add("holder_age_seconds", lease_labels + [lease.holder.job], lease.held_for_s)
    served = lease.members[:max(0, max_members)]
    for member in served:
        labels = lease_labels + [member.job, str(member.pid), str(member.pid_ns)]
        use = member.usage
        add("device_hold_seconds_total", labels, use.hold_s)
        add("acquires_total", labels, use.acquires)
        add("contended_acquires_total", labels, use.contended)
        add("handoffs_total", labels, use.handoffs)
        add("link_turns_total", labels, use.link_turns)
        add("link_turn_waits_total", labels, use.link_turn_waits)
        add("link_turn_wait_seconds_total", labels, use.link_turn_wait_s)
        add("holding", labels, 1.0 if member.holding else 0.0)
        families[names.PREFIX + "wait_seconds"].add_metric(
            labels, _cumulative(use.wait_buckets, lease.wait_bucket_upper_s), use.wait_s)
    return len(served)


class LeaseCollector(Collector):
    """Reads the lease directory on every scrape (prometheus_client calls collect() per
    request); one scrape at a time, so concurrent scrapers cannot pile up reads. A directory
    that cannot be listed (removed, replaced, unreadable) is reported, not raised: a failing
    collect() would fail every scrape, and the exporter's own gauges with it."""

    def __init__(self, lease_dir: str | os.PathLike | None = None, group: str | None = None,
                 bound_s: float = SCRAPE_BOUND_S) -> None:
        # Checked at start too: fail early.
        self.lease_dir = resolve_lease_dir(lease_dir, observer=True)
        check_library()
        self.group = group
        self.bound_s = bound_s
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            start = time.monotonic()
            families = _families()
            # The series bound (exporter_metrics.MAX_MEMBERS_PER_*): members past it are not
            # even decoded, so reading stays as cheap as rendering.
            budget = [MAX_MEMBERS_PER_SCRAPE]

            def read_one(path: os.PathLike, bound_s: float) -> Observation:
                lease = observe(path, bound_s, min(MAX_MEMBERS_PER_LEASE, budget[0]))
                budget[0] -= min(len(lease.members), MAX_MEMBERS_PER_LEASE, budget[0])
                return lease

            try:
                result = read_directory(self.lease_dir, self.group, read_one, (LeaseReadError,),
                                        self.bound_s, OBSERVE_BOUND_S)
            except (LeaseDirError, OSError) as err:
                print(f"crossover lease exporter: {err}", file=sys.stderr, flush=True)
                read, skipped, untrusted, readable = [], 0, 0, 0
            else:
                read, skipped, untrusted = result.read, result.skipped_files, result.untrusted
                readable = 1
            left, truncated = MAX_MEMBERS_PER_SCRAPE, 0
            for segment, lease in read:
                served = add_lease(families, segment.group, segment.device_key, lease,
                                   min(MAX_MEMBERS_PER_LEASE, left))
                left -= served
                truncated += lease.member_count - served
            families[names.PREFIX + "exporter_directory_readable"].add_metric([], readable)
            families[names.PREFIX + "exporter_leases"].add_metric([], len(read))
            families[names.PREFIX + "exporter_skipped_files"].add_metric([], skipped)
            families[names.PREFIX + "exporter_untrusted_files"].add_metric([], untrusted)
            families[names.PREFIX + "exporter_truncated_members"].add_metric([], truncated)
            families[names.PREFIX + "exporter_scrape_seconds"].add_metric(
                [], time.monotonic() - start)
        yield from families.values()


def serve(port: int, address: str, lease_dir: str | None, group: str | None,
          web: WebConfig | None = None) -> None:
    """Serves the metrics until killed (cli.py hides the GPUs first, loads `web`, the
    --web.config.file, and refuses an unprotected address beyond loopback)."""
    collector = LeaseCollector(lease_dir, group)
    REGISTRY.register(collector)
    server = start_server(address, port, make_wsgi_app(REGISTRY), web)
    reload_on_sighup(server)
    scheme = web.scheme if web is not None else "http"
    how = f" ({web.describe()}, from {web.path})" if web is not None else ""
    print(f"crossover lease exporter: serving {scheme}://{address}:{port}/metrics for "
          f"{collector.lease_dir}{how}", flush=True)
    threading.Event().wait()


def reload_on_sighup(server: WSGIServer) -> None:
    """SIGHUP re-reads the web config now, as the Prometheus exporters' operators expect of a
    daemon (a change is also noticed by itself, from the files' times; a file replaced within
    the clock's resolution is not). Call from the main thread; no web config: nothing to do."""
    live = getattr(server, "web", None)
    if live is not None:
        signal.signal(signal.SIGHUP, lambda signum, frame: live.reload())
