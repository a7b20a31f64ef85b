"""The node exporter against a real Prometheus server: a crossed pair of TensorFlow jobs trains
while Prometheus (Debian's, scripts/install_prometheus.sh) scrapes the exporter every second;
what Prometheus stored must agree with the jobs' own lease statistics.
"""
from __future__ import annotations

import contextlib
import json
import pathlib
import subprocess
import sys
import time
from typing import Any, Iterator

import pytest

from lease_helpers import exporter, wait_for
from prometheus_server import prometheus_servers
from crossover_tf.lease import segments
from conftest import WORKERS

pytest.importorskip("prometheus_client", reason="prometheus-client (scripts/install.sh)")

WORKER = str(WORKERS / "strategy_worker.py")
STEPS = 400
SCRAPE_S = 1.0


@pytest.fixture
def prometheus_factory(tmp_path):
    yield from prometheus_servers(tmp_path / "prometheus")


@contextlib.contextmanager
def scraped_lease_dir(tmp_path: pathlib.Path, child_env: dict[str, str],
                      prometheus_factory) -> Iterator[tuple[dict[str, str], Any]]:
    """A lease directory of the test's own, its exporter, and a Prometheus server scraping it
    every SCRAPE_S (its target up); yields the jobs' environment and the server."""
    leases = tmp_path / "leases"
    leases.mkdir(mode=0o700)
    env = {**child_env, segments.LEASE_DIR_ENV: str(leases)}
    with exporter(leases, env) as port:
        prom = prometheus_factory([f"127.0.0.1:{port}"], scrape_interval_s=SCRAPE_S)
        prom.wait_for_targets_up(timeout_s=30)
        yield env, prom


def raw_samples(prom, promql: str) -> dict[str, list[tuple[float, float]]]:
    """The raw samples (scrape time, value) of a range selector, by crossover_job."""
    return {r["metric"].get("crossover_job", ""): [(float(t), float(v)) for t, v in r["values"]]
            for r in prom.query(promql)}


@pytest.mark.slow
@pytest.mark.multiprocess
def test_prometheus_sees_each_jobs_share_of_a_crossed_pair(tmp_path, lease_group, child_env,
                                                           prometheus_factory):
    barrier, linger = tmp_path / "barrier", tmp_path / "linger"
    barrier.mkdir()
    outs = {job: tmp_path / f"{job}.json" for job in ("jobA", "jobB")}
    jobs = []
    try:
        with scraped_lease_dir(tmp_path, child_env, prometheus_factory) as (env, prom):
            jobs = [subprocess.Popen(
                [sys.executable, WORKER, str(out), "--group", lease_group, "--jobs", "2",
                 "--steps", str(STEPS), "--fit_only", "--job", job, "--linger", str(linger),
                 "--barrier", f"{barrier}:2"], env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True) for job, out in outs.items()]
            wait_for(lambda: all(o.exists() or j.poll() is not None
                                 for o, j in zip(outs.values(), jobs)), 300, "the pair's fit")
            assert all(o.exists() for o in outs.values()), [j.communicate()[0][-3000:]
                                                            for j in jobs]
            # The jobs stay on the lease, holding nothing, until their last counters are
            # scraped: three scrape intervals.
            time.sleep(3 * SCRAPE_S + 0.5)
            selector = f'{{group="{lease_group}"}}[10m]'
            hold = raw_samples(prom, "crossover_lease_device_hold_seconds_total" + selector)
            acquires = raw_samples(prom, "crossover_lease_acquires_total" + selector)
            handoffs = raw_samples(prom, "crossover_lease_handoffs_total" + selector)
            overlaps = prom.query_value(
                f"max_over_time(crossover_lease_overlapping_holds_total{selector})")
            members = prom.query_value(f"max_over_time(crossover_lease_members{selector})")
            linger.touch()
            for job in jobs:
                job.wait(timeout=60)
    finally:
        linger.touch()
        for job in jobs:
            if job.poll() is None:
                job.kill()
                job.wait()
    stats = {job: json.loads(out.read_text())["lease_stats"] for job, out in outs.items()}
    assert set(hold) == set(stats), (hold.keys(), stats.keys())
    assert overlaps == 0 and members == 2, (overlaps, members)
    for job, own in stats.items():
        # The last scrape came after the job's last hold: Prometheus's total is the job's own.
        assert hold[job][-1][1] == pytest.approx(own["hold_s"], rel=0.01, abs=0.005), (job, own)
        assert acquires[job][-1][1] == own["acquires"] == 2 * STEPS, (job, own)  # compute, apply
        assert handoffs[job][-1][1] == own["handoffs"], (job, own)
        assert len(hold[job]) >= 5, f"only {len(hold[job])} scrapes of {job}"
    # Each job's share of the device between two scrapes both jobs were in, from Prometheus's
    # own samples: the shares sum to at most 1 (one scrape's reading time apart at most).
    times = sorted(set.intersection(*({t for t, _ in hold[j]} for j in stats)))
    first, last = times[0], times[-1]
    assert last - first >= 3 * SCRAPE_S, times
    at = {job: dict(samples) for job, samples in hold.items()}
    shares = {job: (at[job][last] - at[job][first]) / (last - first) for job in stats}
    print(f"device shares over {last - first:.0f} s of scrapes: {shares}, "
          f"sum {sum(shares.values()):.3f}")
    assert sum(shares.values()) <= 1.01, shares
    assert all(share > 0 for share in shares.values()), shares


def own_hold_s(record: pathlib.Path, start_mono: float, end_mono: float) -> float:
    """Seconds of lease_cli's holds ("start_ns end_ns" per cycle, CLOCK_MONOTONIC) inside the
    window."""
    total = 0.0
    for line in record.read_text().splitlines():
        start, end = (int(n) / 1e9 for n in line.split())
        total += max(0.0, min(end, end_mono) - max(start, start_mono))
    return total


@pytest.mark.slow
@pytest.mark.multiprocess
def test_prometheus_shares_of_a_busy_device_sum_to_at_most_one(tmp_path, lease_group, lease_cli,
                                                               child_env, prometheus_factory):
    """Two contenders keep the device busy (2 ms holds, back to back): the shares Prometheus
    computes from its samples sum to nearly 1 and never above, and each is the contender's own
    record of its holds in the same window."""
    records = {job: tmp_path / f"{job}.out" for job in ("jobA", "jobB")}
    contenders = []
    try:
        with scraped_lease_dir(tmp_path, child_env, prometheus_factory) as (env, prom):
            contenders = [subprocess.Popen([str(lease_cli), "cycles", lease_group, "dev", "4000",
                                            "2000", str(out)],
                                           env={**env, "CROSSOVER_LEASE_JOB": job},
                                           stdout=subprocess.DEVNULL)
                          for job, out in records.items()]
            wait_for(lambda: all(c.poll() is not None for c in contenders), 120, "contenders")
            hold = raw_samples(prom, "crossover_lease_device_hold_seconds_total"
                               f'{{group="{lease_group}"}}[10m]')
    finally:
        for proc in contenders:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert all(c.returncode == 0 for c in contenders)
    times = sorted(set.intersection(*({t for t, _ in hold[j]} for j in records)))
    assert len(times) >= 4, times
    first, last = times[0], times[-1]
    wall_to_mono = time.monotonic() - time.time()  # one host, no time namespace
    at = {job: dict(samples) for job, samples in hold.items()}
    shares = {job: (at[job][last] - at[job][first]) / (last - first) for job in records}
    own = {job: own_hold_s(out, first + wall_to_mono, last + wall_to_mono) / (last - first)
           for job, out in records.items()}
    print(f"shares over {last - first:.1f} s: Prometheus {shares}, the contenders' own {own}")
    assert 0.8 < sum(shares.values()) <= 1.01, shares
    for job in records:
        # Their own record is the sleep inside each hold (a few µs short of the hold).
        assert shares[job] == pytest.approx(own[job], abs=0.03), (shares, own)
