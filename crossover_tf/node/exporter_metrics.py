"""The node exporter's metrics: names, types, labels and help, in one table.

Apart from the exporter (exporter.py) so that the deployment files that use these names (the
Grafana dashboard, alert rules, docs/exporter.md) are checked against one list without importing
prometheus_client. Names follow Prometheus's conventions: base units (seconds), `_total` on
counters, `_seconds_total` on counted time.

Labels: every series carries `group` and `device` (the lease's group and device key); a
member's series also carry `crossover_job` (its job label), `pid` and `pid_ns` (its PID
namespace: two containers' processes may share a pid; two processes of one job on one device
are two members). The job label is not called `job`: Prometheus sets `job` on
every target it scrapes (the scrape job's name), and a `job` label from an exporter would be
renamed `exported_job` unless every scrape config set `honor_labels`.
"""
from __future__ import annotations

import dataclasses

PREFIX = "crossover_lease_"
LEASE_LABELS = ("group", "device")
MEMBER_LABELS = LEASE_LABELS + ("crossover_job", "pid", "pid_ns")
HOLDER_LABELS = LEASE_LABELS + ("crossover_job",)
# Upper bounds (seconds) of the acquire-wait histogram's buckets: the C++ core's
# kWaitBucketUpperNs (ops/core/lease_types.h), which counts them in the segment.
WAIT_BUCKETS_S = (1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 60.0)
# The series bound (issue 48, item 5): whoever may write a segment can fill its 64 slots with
# members kept live by their lock bytes, so a scrape serves member series (18 samples each)
# for at most this many members per lease (the holder first, then by slot) and this many in
# all (leases in listing order: in turns by owner, so one user's forged leases cannot spend
# another's share), and counts the rest (exporter_truncated_members). A lease's
# own series (members, queue, totals, holder age: 5 samples) are served for every lease read,
# at most MAX_SEGMENTS (1,000): one scrape is at most ~14,200 samples, whatever is planted.
# 512 is a node of 8 devices with the segment's 64 members on each.
MAX_MEMBERS_PER_LEASE = 16
MAX_MEMBERS_PER_SCRAPE = 512


@dataclasses.dataclass(frozen=True)
class Metric:
    """One metric family the exporter serves."""
    name: str
    kind: str  # counter | gauge | histogram (as prometheus_client's *MetricFamily)
    labels: tuple[str, ...]
    help: str


METRICS = (
    # Per member (one process of a job on one device's lease).
    Metric(PREFIX + "device_hold_seconds_total", "counter", MEMBER_LABELS,
           "Seconds this member held the device (its current hold included)."),
    Metric(PREFIX + "acquires_total", "counter", MEMBER_LABELS,
           "Acquisitions of the device by this member."),
    Metric(PREFIX + "contended_acquires_total", "counter", MEMBER_LABELS,
           "Acquisitions that had to wait behind a holder or a waiter."),
    Metric(PREFIX + "handoffs_total", "counter", MEMBER_LABELS,
           "Acquisitions that took the device over from another process."),
    Metric(PREFIX + "wait_seconds", "histogram", MEMBER_LABELS,
           "Time from asking for the device to holding it, per acquisition."),
    Metric(PREFIX + "link_turns_total", "counter", MEMBER_LABELS,
           "Link turns taken (allreduces started in the group's order)."),
    Metric(PREFIX + "link_turn_waits_total", "counter", MEMBER_LABELS,
           "Link turns that had to wait for another job's allreduce."),
    Metric(PREFIX + "link_turn_wait_seconds_total", "counter", MEMBER_LABELS,
           "Seconds spent waiting for link turns."),
    Metric(PREFIX + "holding", "gauge", MEMBER_LABELS,
           "1 while this member holds the device."),
    # Per lease (one device of one group).
    Metric(PREFIX + "members", "gauge", LEASE_LABELS, "Live processes on the lease."),
    Metric(PREFIX + "queue_length", "gauge", LEASE_LABELS,
           "Threads waiting for the device."),
    Metric(PREFIX + "holder_age_seconds", "gauge", HOLDER_LABELS,
           "How long the current holder has held the device (absent while it is free)."),
    Metric(PREFIX + "overlapping_holds_total", "counter", LEASE_LABELS,
           "Holds that began while another process was inside its hold. Always 0: "
           "anything else is a broken exclusion."),
    Metric(PREFIX + "recoveries_total", "counter", LEASE_LABELS,
           "Dead holders, waiters and link-turn entries the members repaired."),
    # The exporter itself.
    Metric(PREFIX + "exporter_leases", "gauge", (),
           "Lease files read in the last scrape (names that may be leases: untrusted names "
           "are counted apart, in exporter_untrusted_files)."),
    Metric(PREFIX + "exporter_directory_readable", "gauge", (),
           "1 if the last scrape could list the lease directory (0: it vanished, was replaced "
           "by a non-local file system, or cannot be read; no lease is exported)."),
    Metric(PREFIX + "exporter_skipped_files", "gauge", (),
           "Lease files the last scrape skipped (failed the trust rule, unreadable, of another "
           "layout, or past the scrape's time bound or its first 1,000 names); those that fail "
           "the trust rule by name alone are also in exporter_untrusted_files."),
    Metric(PREFIX + "exporter_untrusted_files", "gauge", (),
           "Lease file names the last scrape never read because they fail the trust rule by "
           "their lstat alone (empty, not a regular file, or open to others: planted, not "
           "leases); counted apart from the leases read."),
    Metric(PREFIX + "exporter_truncated_members", "gauge", (),
           f"Live members the last scrape served no series for: past {MAX_MEMBERS_PER_LEASE} "
           f"on one lease (the holder first) or {MAX_MEMBERS_PER_SCRAPE} in all. Their "
           "lease's crossover_lease_members still counts them."),
    Metric(PREFIX + "exporter_scrape_seconds", "gauge", (),
           "How long the last scrape took to read the lease directory."),
)
METRIC_NAMES = frozenset(m.name for m in METRICS)
# The names a scrape's text shows: a histogram adds _bucket, _sum and _count, and
# prometheus_client writes a counter's samples with `_total` (and a `_created` beside them).
SAMPLE_NAMES = frozenset(
    [m.name for m in METRICS if m.kind != "histogram"]
    + [m.name + suffix for m in METRICS if m.kind == "histogram"
       for suffix in ("_bucket", "_sum", "_count")])
