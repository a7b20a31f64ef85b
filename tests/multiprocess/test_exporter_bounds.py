"""Planted names cannot hide a lease or swamp the exporter and `status` (issue 48, item 5).

Two kinds of planted file: names that fail the trust rule (empty, 0666, not a regular file;
anyone may make them in a sticky shared directory), which are counted apart from the leases and
never read; and forged leases that pass it (a segment's user, or in group mode any member of
the directory's group, can fill a segment's 64 slots with members kept live by holding their
lock bytes: benchmarks/exporter_scrape.py makes them), whose series are bounded per lease and
per scrape, the rest counted.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time
import tracemalloc

import pytest

from conftest import REPO_ROOT
from lease_helpers import OUTSIDER_UID, as_user, needs_other_users, real_holder, scratch_base
from benchmarks.exporter_scrape import count_samples, forge_template, plant_forged_leases
from crossover_tf.lease import segments

pytest.importorskip("prometheus_client", reason="prometheus-client (scripts/install.sh)")
pytestmark = pytest.mark.multiprocess  # lease_cli members make the template, and the real leases

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

# Per lease: members, queue_length, overlapping_holds_total, recoveries_total, holder_age.
LEASE_SAMPLES = 5
MEMBER_SAMPLES = 18  # 7 counters, holding, and the histogram's 8 buckets, _sum and _count


@pytest.fixture(scope="module")
def template(tmp_path_factory, lease_cli):
    return forge_template(tmp_path_factory.mktemp("template"), lease_cli)


@pytest.fixture
def forged(tmp_path, template):
    """plant(count, members, prefix): forged leases in tmp_path/leases, live until the end."""
    leases = tmp_path / "leases"
    leases.mkdir(mode=0o700)
    fds = []

    def plant(count: int, members: int, prefix: str = "forged") -> pathlib.Path:
        fds.extend(plant_forged_leases(leases, template, count, members, prefix))
        return leases
    yield plant
    for fd in fds:
        os.close(fd)


def registry_for(leases: pathlib.Path) -> CollectorRegistry:
    from crossover_tf.node.exporter import LeaseCollector
    registry = CollectorRegistry()
    registry.register(LeaseCollector(leases))
    return registry


def scrape(leases: pathlib.Path) -> tuple[bytes, dict]:
    """One scrape as Prometheus takes it (collect, then the text): (text, {(name, labels): v})."""
    text = generate_latest(registry_for(leases))
    samples = {(s.name, frozenset(s.labels.items())): s.value
               for family in text_string_to_metric_families(text.decode())
               for s in family.samples}
    return text, samples


def sample(samples: dict, name: str, **labels: str) -> float:
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls)]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def member_series(samples: dict, **labels: str) -> int:
    return sum(1 for (n, ls), _ in samples.items()
               if n == "crossover_lease_holding" and set(labels.items()) <= set(ls))


def test_one_scrape_of_1000_forged_leases_with_63_members_is_bounded(forged):
    """Before: 1,000 forged leases of 63 live members each made one scrape 1,138,004 samples,
    13.6 s and a 730 MB peak (tracemalloc; 10.4 s and 207 MB in the issue's exporter), past
    Prometheus's 10 s scrape timeout. Now each lease serves at most MAX_MEMBERS_PER_LEASE
    members' series, a scrape at most MAX_MEMBERS_PER_SCRAPE, the rest counted: 13,222
    samples, 0.40 s and 8.6 MB (benchmarks/exporter_scrape.py prints it)."""
    from crossover_tf.node import exporter
    leases = forged(1000, 63)
    start = time.perf_counter()
    text, samples = scrape(leases)
    took = time.perf_counter() - start
    bound = (1000 * LEASE_SAMPLES + exporter.MAX_MEMBERS_PER_SCRAPE * MEMBER_SAMPLES + 20)
    assert count_samples(text) <= bound, count_samples(text)
    assert sample(samples, "crossover_lease_exporter_leases") == 1000
    assert member_series(samples) == exporter.MAX_MEMBERS_PER_SCRAPE
    assert (sample(samples, "crossover_lease_exporter_truncated_members")
            == 1000 * 63 - exporter.MAX_MEMBERS_PER_SCRAPE)
    # Every lease still says how many live members it has.
    assert sample(samples, "crossover_lease_members", group="forged0999", device="dev") == 63
    registry = registry_for(leases)
    tracemalloc.start()
    try:
        generate_latest(registry)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, f"one scrape peaked at {peak / 2**20:.1f} MB"
    # Loose for a shared 2-core test machine; the benchmark measures it.
    assert took < 3, f"one scrape took {took:.2f} s"


def test_member_series_are_capped_per_lease_and_per_scrape_and_counted(forged):
    """A lease's member series stop at MAX_MEMBERS_PER_LEASE (its `members` gauge keeps the
    whole count) and a scrape's at MAX_MEMBERS_PER_SCRAPE, in lease order; what is left out
    is counted in crossover_lease_exporter_truncated_members."""
    from crossover_tf.node import exporter
    per_lease, per_scrape = exporter.MAX_MEMBERS_PER_LEASE, exporter.MAX_MEMBERS_PER_SCRAPE
    leases = forged(3, 63)
    _, samples = scrape(leases)
    for i in range(3):
        lease = {"group": f"forged{i:04d}", "device": "dev"}
        assert sample(samples, "crossover_lease_members", **lease) == 63
        assert member_series(samples, **lease) == per_lease
    assert sample(samples, "crossover_lease_exporter_truncated_members") == 3 * (63 - per_lease)
    full = per_scrape // per_lease + 2  # more leases than the scrape's budget serves in full
    forged(full - 3, 63, prefix="more")
    _, samples = scrape(leases)
    assert member_series(samples) == per_scrape
    assert sample(samples, "crossover_lease_exporter_truncated_members") == full * 63 - per_scrape
    assert sample(samples, "crossover_lease_exporter_leases") == full


def _plant_untrusted(leases: pathlib.Path, count: int) -> None:
    """count names anyone could make in a sticky shared directory: empty, or 0666."""
    for i in range(count):
        path = leases / f"crossover.a{i:05d}.dev"  # sorted before the real lease
        if i % 2:
            path.write_bytes(b"x" * 64)
            path.chmod(0o666)
        else:
            path.touch()


def test_exporter_counts_untrusted_names_apart_and_serves_the_real_lease(tmp_path, lease_group,
                                                                         lease_cli, child_env):
    """Before: the exporter read the first 1,000 names (the real lease, then 999 planted ones,
    each refused by the core) and counted the 10,000 planted names as 1,000 skipped files; no
    metric told planted names from leases it could not read. Now names that fail the trust
    rule are never read and are counted in crossover_lease_exporter_untrusted_files."""
    with real_holder(tmp_path, lease_group, lease_cli, child_env) as (leases, _, _):
        _plant_untrusted(leases, 10_000)
        _, samples = scrape(leases)
    assert sample(samples, "crossover_lease_exporter_leases") == 1
    assert sample(samples, "crossover_lease_exporter_untrusted_files") == 10_000
    assert sample(samples, "crossover_lease_exporter_skipped_files") == 10_000
    assert sample(samples, "crossover_lease_holding", crossover_job="real", group=lease_group,
                  device="dev") == 1


@pytest.mark.slow
def test_status_shows_the_real_lease_among_10000_planted_names(tmp_path, lease_group, lease_cli,
                                                               child_env):
    """Before: status showed the real lease, then 999 lines naming planted files one by one
    and one line for the 9,001 not shown. Now the names that fail the trust rule are counted
    apart from the leases, the first few named with the core's reason."""
    with real_holder(tmp_path, lease_group, lease_cli, child_env) as (leases, env, holder_pid):
        _plant_untrusted(leases, 10_000)
        shown = subprocess.run([sys.executable, "-m", "crossover_tf.lease", "status"],
                               capture_output=True, text=True, timeout=120, env=env,
                               cwd=REPO_ROOT)
    text = shown.stdout
    assert shown.returncode == 1, shown
    real = segments.segment_path(lease_group, "dev", leases)
    assert text.startswith(f"lease {real}\n"), text[:2000]
    assert f"holder: job real  pid {holder_pid}" in text, text[:2000]
    assert "10000 name(s) that fail the trust rule" in text, text[-3000:]
    assert f"{leases.resolve()}/crossover.a00000.dev: " in text, text[-3000:]
    assert "has permissions 0666" in text, text[-3000:]
    assert len(text.splitlines()) < 40, f"{len(text.splitlines())} lines:\n{text[-3000:]}"


def _plant_as_another_user(leases: pathlib.Path, count: int) -> None:
    """count empty names and count one-byte 0600 files, made as OUTSIDER_UID (anyone may, in a
    sticky shared directory), named to sort before the real lease; the one-byte files pass
    the trust rule by their lstat."""
    script = (f"cd {leases} && umask 077 && i=0 && while [ $i -lt {count} ]; do "
              "n=$(printf %04d $i); : > crossover.a2empty$n.dev; "
              "printf x > crossover.a1byte$n.dev; i=$((i + 1)); done")
    made = subprocess.run(as_user(OUTSIDER_UID, (), "sh", "-c", script), capture_output=True,
                          text=True, timeout=120)
    assert made.returncode == 0, made.stderr


@needs_other_users
def test_another_users_planted_names_cannot_hide_a_live_lease(tmp_path, template, lease_group,
                                                              lease_cli, child_env):
    """Before (issue 59, item 7): names another user planted to sort first that pass the
    trust rule by their lstat (1,000 one-byte 0600 files, or 1,000 forged segments with live
    members) filled the first MAX_SEGMENTS names read: the live lease got no series in the
    exporter and status did not list it. Now names are read in turns by owner: the planter's
    3,000 names (1,000 each of empty, one-byte and forged) delay the real lease by one read,
    and the global bounds hold."""
    from crossover_tf.node import exporter
    fds: list[int] = []
    try:
        with scratch_base() as base, real_holder(tmp_path, lease_group, lease_cli, child_env,
                                                 base) as (leases, env, holder_pid):
            _plant_as_another_user(leases, 1000)
            fds = plant_forged_leases(leases, template, 1000, 63, prefix="a0forged")
            for fd in fds:
                os.fchown(fd, OUTSIDER_UID, OUTSIDER_UID)
            real = segments.segment_path(lease_group, "dev", leases)
            start = time.perf_counter()
            text, samples = scrape(leases)
            took = time.perf_counter() - start
            shown = subprocess.run([sys.executable, "-m", "crossover_tf.lease", "status"],
                                   capture_output=True, text=True, timeout=120, env=env,
                                   cwd=REPO_ROOT)
    finally:
        for fd in fds:
            os.close(fd)
    lease = {"group": lease_group, "device": "dev"}
    assert sample(samples, "crossover_lease_holding", crossover_job="real", **lease) == 1
    assert sample(samples, "crossover_lease_members", **lease) == 1
    assert sample(samples, "crossover_lease_exporter_leases") == 1000  # itself and 999 forged
    assert sample(samples, "crossover_lease_exporter_untrusted_files") == 1000
    bound = 1000 * LEASE_SAMPLES + exporter.MAX_MEMBERS_PER_SCRAPE * MEMBER_SAMPLES + 20
    assert count_samples(text) <= bound, count_samples(text)
    assert took < 3, f"one scrape took {took:.2f} s"
    assert f"lease {real}\n" in shown.stdout, shown.stdout[:3000]
    assert f"holder: job real  pid {holder_pid}" in shown.stdout, shown.stdout[:3000]


def test_the_benchmark_prints_one_scrapes_time_memory_and_samples(child_env, tmp_path):
    """`python -m benchmarks.exporter_scrape --short` (50 forged leases of 63 members): its
    result line, with the samples the bound allows."""
    from crossover_tf.node import exporter_metrics
    out = subprocess.run([sys.executable, "-m", "benchmarks.exporter_scrape", "--short"],
                         capture_output=True, text=True, timeout=180, env=child_env,
                         cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("result:"))
    samples = int(line.split(", ")[-1].split()[0])
    assert samples == 50 * 4 + exporter_metrics.MAX_MEMBERS_PER_SCRAPE * MEMBER_SAMPLES + 6, line
