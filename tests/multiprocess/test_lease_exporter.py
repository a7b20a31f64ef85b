"""The node exporter (`python -m crossover_tf.lease exporter`): what it serves for live leases,
that it never stalls or joins, that it needs no TensorFlow, and its clear errors.

Leases are made by the core's CLI (lease_cli: real processes, no TensorFlow); the exporter runs
as an operator would start it and is scraped over HTTP. A real Prometheus server scraping a
crossed pair of TensorFlow jobs is tests/system/test_lease_exporter_prometheus.py.
"""
from __future__ import annotations

import pathlib
import socket
import subprocess
import sys
import time

import pytest

from conftest import REPO_ROOT
from lease_helpers import (GROUP_GID, USER_UIDS, as_user, exporter, group_dir, needs_other_users,
                           real_holder, scrape, value, wait_for)
from benchmarks.exporter_scrape import JOB_OFFSET
from crossover_tf.lease import segments
from crossover_tf.node import exporter_metrics

pytest.importorskip("prometheus_client", reason="prometheus-client (scripts/install.sh)")

@pytest.fixture
def lease_env(tmp_path, child_env) -> tuple[pathlib.Path, dict[str, str]]:
    leases = tmp_path / "leases"
    leases.mkdir(mode=0o700)
    return leases, {**child_env, segments.LEASE_DIR_ENV: str(leases)}


def test_tensorflow_free_parts_import_without_tensorflow_or_horovod(child_env):
    """Before: `from crossover_tf.lease import segments` ran crossover_tf/__init__, which
    imported the strategy, TensorFlow and Horovod. Now the package exports are lazy, and the
    lease directory, the observer, the exporter and the CLI import with both blocked."""
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "horovod", "keras"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
import crossover_tf.lease.segments, crossover_tf.node.observer, crossover_tf.node.exporter
import crossover_tf.node.cli, crossover_tf.node.directory_reader
print("imported without TensorFlow")
"""
    out = subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "imported without TensorFlow" in out.stdout, out.stderr


def test_exporter_serves_members_holder_queue_and_counters(tmp_path, lease_group, lease_cli,
                                                           lease_env):
    leases, env = lease_env
    holder = subprocess.Popen([str(lease_cli), "hold", lease_group, "dev",
                               str(tmp_path / "ready")], env={**env, "CROSSOVER_LEASE_JOB": "jobA"})
    waiter = None
    try:
        wait_for((tmp_path / "ready").exists, 30, "the holder")
        held_at = time.monotonic()
        waiter = subprocess.Popen([str(lease_cli), "acquire", lease_group, "dev", "30",
                                   str(tmp_path / "acquired")],
                                  env={**env, "CROSSOVER_LEASE_JOB": "jobB"})
        lease = {"group": lease_group, "device": "dev"}
        with exporter(leases, env) as port:
            wait_for(lambda: value(scrape(port), "crossover_lease_queue_length", **lease) == 1,
                     30, "the waiter in the queue")
            first = scrape(port)
            age = value(first, "crossover_lease_holder_age_seconds", crossover_job="jobA", **lease)
            time.sleep(0.3)
            second = scrape(port)
            holder.kill()
            holder.wait()
            wait_for(lambda: waiter.poll() is not None, 30, "the waiter's acquire")
            after = scrape(port)
    finally:
        for proc in (holder, waiter):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    a, b = dict(crossover_job="jobA", **lease), dict(crossover_job="jobB", **lease)
    assert value(first, "crossover_lease_members", **lease) == 2
    assert value(first, "crossover_lease_holding", **a) == 1
    assert value(first, "crossover_lease_holding", **b) == 0
    assert 0 < age <= time.monotonic() - held_at
    # The current hold counts, and keeps counting: the counter never waits for a release.
    assert value(first, "crossover_lease_device_hold_seconds_total", **a) == pytest.approx(age,
                                                                                          abs=0.05)
    grew = (value(second, "crossover_lease_device_hold_seconds_total", **a)
            - value(first, "crossover_lease_device_hold_seconds_total", **a))
    assert 0.25 < grew < 5, grew
    assert value(first, "crossover_lease_acquires_total", **a) == 1
    assert value(first, "crossover_lease_acquires_total", **b) == 0
    assert value(first, "crossover_lease_overlapping_holds_total", **lease) == 0
    assert value(first, "crossover_lease_exporter_leases") == 1
    assert value(first, "crossover_lease_exporter_skipped_files") == 0
    # Every family of the table is served for a held lease, and nothing else.
    served = {name for name, _ in first if name.startswith(exporter_metrics.PREFIX)}
    assert served == exporter_metrics.SAMPLE_NAMES, served ^ exporter_metrics.SAMPLE_NAMES
    # The waiter got the device once the holder died: its wait is in the histogram.
    assert (tmp_path / "acquired").read_text().startswith("ok"), (tmp_path / "acquired").read_text()
    assert waiter.returncode == 0
    assert value(after, "crossover_lease_exporter_leases") in (0, 1)  # its last member removes it


def test_wait_histogram_counts_every_acquire(tmp_path, lease_group, lease_cli, lease_env):
    """Two contenders cycling: each member's histogram is cumulative, its count is its
    acquires, its sum its wait; hand-offs and contended acquires are counted; no overlap."""
    leases, env = lease_env
    contenders = [subprocess.Popen([str(lease_cli), "cycles", lease_group, "dev", "4000", "1000",
                                    str(tmp_path / f"{job}.out")],
                                   env={**env, "CROSSOVER_LEASE_JOB": job},
                                   stdout=subprocess.DEVNULL)
                  for job in ("jobA", "jobB")]
    lease = {"group": lease_group, "device": "dev"}
    try:
        with exporter(leases, env) as port:
            wait_for(lambda: len([k for k in scrape(port)
                                  if k[0] == "crossover_lease_acquires_total"]) == 2, 30,
                     "both contenders on the lease")
            time.sleep(0.5)
            samples = scrape(port)
    finally:
        for proc in contenders:
            proc.kill()
            proc.wait()
    bounds = [*map(repr, exporter_metrics.WAIT_BUCKETS_S), "+Inf"]
    for job in ("jobA", "jobB"):
        labels = dict(crossover_job=job, **lease)
        acquires = value(samples, "crossover_lease_acquires_total", **labels)
        buckets = [value(samples, "crossover_lease_wait_seconds_bucket", le=le, **labels)
                   for le in bounds]
        assert buckets == sorted(buckets) and buckets[-1] == acquires > 10, (job, buckets)
        assert value(samples, "crossover_lease_wait_seconds_count", **labels) == acquires
        assert value(samples, "crossover_lease_wait_seconds_sum", **labels) > 0
        assert 0 < value(samples, "crossover_lease_handoffs_total", **labels) <= acquires
        assert 0 < value(samples, "crossover_lease_contended_acquires_total", **labels) <= acquires
    assert value(samples, "crossover_lease_overlapping_holds_total", **lease) == 0
    holding = sum(value(samples, "crossover_lease_holding", crossover_job=job, **lease)
                  for job in ("jobA", "jobB"))
    assert holding <= 1


def test_exporter_skips_untrusted_files_and_serves_the_rest(tmp_path, lease_group, lease_cli,
                                                            child_env):
    """A file another user could have planted (0666 in a sticky world-writable directory, as
    /dev/shm) is skipped and counted; the real lease beside it is served."""
    with real_holder(tmp_path, lease_group, lease_cli, child_env) as (leases, env, _):
        planted = leases / "crossover.planted.dev"
        planted.write_bytes(segments.segment_path(lease_group, "dev", leases).read_bytes())
        planted.chmod(0o666)
        with exporter(leases, env) as port:
            samples = scrape(port)
    assert value(samples, "crossover_lease_exporter_skipped_files") == 1
    assert value(samples, "crossover_lease_exporter_leases") == 1
    assert value(samples, "crossover_lease_holding", crossover_job="real", group=lease_group,
                 device="dev") == 1


def _holder_word(segment: pathlib.Path, job: str, pid: int) -> int:
    """The offset of the segment's holder nonce (SharedLease::holder, an Owner: nonce, slot,
    pid), found without the C++ layout: the first copy of the holder's slot nonce (its slot
    lies JOB_OFFSET before its job label) followed, after the slot, by the holder's pid."""
    data = segment.read_bytes()
    slot = data.index(job.encode() + b"\0") - JOB_OFFSET
    nonce, offset = data[slot:slot + 8], -1
    while True:
        offset = data.index(nonce, offset + 1)
        if int.from_bytes(data[offset + 12:offset + 16], "little") == pid:
            return offset


def _clear_holder_as(uid: int, segment: pathlib.Path, offset: int) -> None:
    """Zeroes the holder nonce at offset as uid, a member of the lease group: every member
    maps the segment writable, and a misbehaving one can write any word of it."""
    cleared = subprocess.run(as_user(uid, (GROUP_GID,), "dd", "if=/dev/zero", f"of={segment}",
                                     "bs=8", "count=1", f"seek={offset}", "oflag=seek_bytes",
                                     "conv=notrunc", "status=none"),
                             capture_output=True, text=True, timeout=60)
    assert cleared.returncode == 0, cleared.stderr


@needs_other_users
def test_exporter_and_status_see_a_group_lease_and_the_overlap_a_member_forces(lease_group,
                                                                               lease_cli,
                                                                               child_env):
    """Before (issue 59, item 6): in the sticky 3770 group directory group mode requires, the
    observer applied the private rule and refused the group's 0660 segment (exporter_leases 0,
    skipped_files 1; status did not list it), so the overlapping-hold counter, the check
    against a member that clears the holder word, could never be seen. Now the directory is
    observed as a group-mode one: the lease is served, and when member B zeroes A's holder
    word and acquires while A holds, the overlap is counted and exported. A private job's
    0600 lease in the same directory is read as before."""
    with group_dir() as leases:
        env = {**child_env, segments.LEASE_DIR_ENV: str(leases),
               segments.SHARED_GROUP_ENV: "1"}
        segment = leases / f"crossover.{lease_group}.dev"
        a, b = USER_UIDS
        holder = subprocess.Popen(as_user(a, (GROUP_GID,), str(lease_cli), "hold", lease_group,
                                          "dev", str(leases / "ready")),
                                  env={**env, "CROSSOVER_LEASE_JOB": "memberA"})
        # A job without group mode may use the directory too: its 0600 lease is read beside.
        private = subprocess.Popen([str(lease_cli), "hold", f"{lease_group}p", "dev",
                                    str(leases / "private-ready")],
                                   env={**env, segments.SHARED_GROUP_ENV: "0",
                                        "CROSSOVER_LEASE_JOB": "privateC"})
        try:
            wait_for((leases / "ready").exists, 30, "member A's hold")
            wait_for((leases / "private-ready").exists, 30, "the private job's hold")
            shown = subprocess.run([sys.executable, "-m", "crossover_tf.lease", "status"],
                                   capture_output=True, text=True, timeout=120, env=env,
                                   cwd=REPO_ROOT)
            with exporter(leases, env) as port:
                before = scrape(port)
                _clear_holder_as(b, segment, _holder_word(segment, "memberA", holder.pid))
                acquired = subprocess.run(as_user(
                    b, (GROUP_GID,), str(lease_cli), "acquire", lease_group, "dev", "5",
                    str(leases / "acquired")), env={**env, "CROSSOVER_LEASE_JOB": "memberB"},
                    capture_output=True, text=True, timeout=60)
                after = scrape(port)
        finally:
            for proc in (holder, private):
                proc.kill()
                proc.wait()
        acquired_text = (leases / "acquired").read_text() if acquired.returncode == 0 else ""
    lease = {"group": lease_group, "device": "dev"}
    assert value(before, "crossover_lease_exporter_leases") == 2
    assert value(before, "crossover_lease_exporter_skipped_files") == 0
    assert value(before, "crossover_lease_holding", crossover_job="memberA", **lease) == 1
    assert value(before, "crossover_lease_holding", crossover_job="privateC") == 1
    assert value(before, "crossover_lease_overlapping_holds_total", **lease) == 0
    assert f"lease {segment}" in shown.stdout, (shown.stdout, shown.stderr)
    assert "holder: job memberA" in shown.stdout, shown.stdout
    assert acquired.returncode == 0 and acquired_text.startswith("ok"), (acquired,
                                                                           acquired_text)
    assert value(after, "crossover_lease_overlapping_holds_total", **lease) == 1


def test_exporter_errors_are_one_clear_line(tmp_path, child_env):
    command = [sys.executable, "-m", "crossover_tf.lease", "exporter", "--address", "127.0.0.1"]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = subprocess.run([*command, "--port", str(port), "--lease_dir", str(tmp_path)],
                              env=child_env, capture_output=True, text=True, timeout=60)
    assert busy.returncode == 1 and busy.stderr.startswith("error: "), busy
    assert "Address already in use" in busy.stderr, busy.stderr
    missing = subprocess.run([*command, "--lease_dir", str(tmp_path / "absent")], env=child_env,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "does not exist" in missing.stderr, missing
    bad_port = subprocess.run([*command, "--port", "70000"], env=child_env, capture_output=True,
                              text=True, timeout=60)
    assert bad_port.returncode == 2 and "--port must be in 1-65535" in bad_port.stderr, bad_port
    blocked = ("import sys, runpy\n"
               "sys.modules['prometheus_client'] = None\n"
               "sys.argv = ['crossover_tf.lease', 'exporter', '--lease_dir', sys.argv[1]]\n"
               "runpy.run_module('crossover_tf.lease', run_name='__main__')\n")
    no_client = subprocess.run([sys.executable, "-c", blocked, str(tmp_path)], env=child_env,
                               capture_output=True, text=True, timeout=60)
    assert no_client.returncode == 2, no_client
    assert "pip install 'crossover_tf[exporter]'" in no_client.stderr, no_client.stderr


def test_metric_table_names_follow_prometheus_conventions():
    for metric in exporter_metrics.METRICS:
        assert metric.name.startswith("crossover_lease_"), metric
        assert metric.name.endswith("_total") == (metric.kind == "counter"), metric
        assert "job" not in metric.labels, "Prometheus sets `job` itself: " + metric.name
        if "seconds" in metric.name:
            assert metric.name.endswith(("_seconds", "_seconds_total")), metric
    assert len(exporter_metrics.METRIC_NAMES) == len(exporter_metrics.METRICS)


def test_wait_buckets_are_the_cores():
    """The histogram's bounds are the C++ core's kWaitBucketUpperNs (ops/core/lease_types.h)."""
    header = (REPO_ROOT / "ops" / "core" / "lease_types.h").read_text()
    start = header.index("kWaitBucketUpperNs[kWaitBuckets - 1] = {")
    numbers = header[start:header.index("}", start)].split("{")[1]
    core = tuple(int(n) / 1e9 for n in numbers.replace("\n", " ").split(",") if n.strip())
    assert core == exporter_metrics.WAIT_BUCKETS_S
    assert f"kWaitBuckets = {len(core) + 1};" in header


def test_a_vanished_lease_directory_is_reported_not_a_failed_scrape(tmp_path, child_env):
    """Before: collect() raised when the directory went away, so every scrape failed (HTTP 500)
    and the exporter's own gauges went stale with it. Now the scrape succeeds and says so."""
    leases = tmp_path / "leases"
    leases.mkdir(mode=0o700)
    with exporter(leases, child_env) as port:
        assert value(scrape(port), "crossover_lease_exporter_directory_readable") == 1
        leases.rmdir()
        gone = scrape(port)
    assert value(gone, "crossover_lease_exporter_directory_readable") == 0
    assert value(gone, "crossover_lease_exporter_leases") == 0
