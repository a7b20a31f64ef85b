"""Tests of the device-lease op library: single-process op behaviour (tf.test style) and real
multi-process contention, crash recovery and timeouts."""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from crossover_tf import lease as lease_lib
from crossover_tf.lease import segments
from conftest import WORKERS

WORKER = str(WORKERS / "lease_worker.py")


class LeaseOpTest(tf.test.TestCase):
    """Op-level behaviour inside one process."""

    def setUp(self):
        super().setUp()
        self.group = f"unit{os.getpid()}{self.id().rsplit('.', 1)[-1][:20]}".replace("_", "-")
        self.lease = lease_lib.DeviceLease(self.group, "cpu0")

    def tearDown(self):
        self.lease.yield_device()
        segments.unlink_segment(self.group, "cpu0")
        super().tearDown()

    def test_library_loads_and_registers_ops(self):
        ops = lease_lib.load_library()
        for name in ("crossover_acquire_lease", "crossover_yield_lease",
                     "crossover_lease_stats", "crossover_lease_timeline"):
            self.assertTrue(hasattr(ops, name), name)

    def test_pass_through_values_unchanged(self):
        values = {"f": tf.constant([[1.5, -2.0]]), "i": tf.constant([3, 4], tf.int64),
                  "s": tf.constant(["a", "b"]), "h": tf.constant(1.0, tf.float16)}
        acquired = self.lease.acquire(values)
        released = self.lease.yield_device(acquired)
        for k, v in values.items():
            self.assertEqual(released[k].dtype, v.dtype)
            self.assertAllEqual(released[k], v)

    def test_ops_are_stateful_and_survive_grappler(self):
        @tf.function
        def step(x):
            self.lease.acquire([], tag=lease_lib.TAG_COMPUTE)   # outputs unused on purpose
            y = self.lease.yield_device(x * 2.0)
            return y

        graph = step.get_concrete_function(tf.TensorSpec([2], tf.float32)).graph
        lease_ops = [op for op in graph.get_operations() if op.type.startswith("CrossoverAcquire")
                     or op.type.startswith("CrossoverYield")]
        self.assertLen(lease_ops, 2)
        self.assertTrue(all(op.op_def.is_stateful for op in lease_ops))
        before = self.lease.stats()
        for _ in range(3):
            self.assertAllEqual(step(tf.constant([1.0, 2.0])), [2.0, 4.0])
        after = self.lease.stats()
        self.assertEqual(after.acquires - before.acquires, 3)  # the unused acquire still ran
        self.assertFalse(after.held)
        tags = self.lease.timeline()[-3:, 3]
        self.assertAllEqual(tags, [lease_lib.TAG_COMPUTE] * 3)

    def test_reacquire_is_noop_and_release_is_idempotent(self):
        self.lease.acquire()
        self.lease.acquire()
        self.assertEqual(self.lease.stats().acquires, 1)
        self.lease.yield_device()
        self.lease.yield_device()
        stats = self.lease.stats()
        self.assertFalse(stats.held)
        self.assertGreaterEqual(stats.hold_s, 0.0)

    def test_bad_names_rejected_clearly(self):
        with self.assertRaisesRegex(ValueError, "group 'bad name' is invalid"):
            lease_lib.DeviceLease("bad name", "cpu0")
        with self.assertRaisesRegex(ValueError, "device key"):
            lease_lib.DeviceLease("ok", "a.b")
        with self.assertRaisesRegex(ValueError, "timeout"):
            lease_lib.DeviceLease("ok", "cpu0", timeout_s=0)
        ops = lease_lib.load_library()
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "group 'x/y' is invalid"):
            ops.crossover_acquire_lease([], group="x/y", device_key="cpu0")

    def test_stale_segment_of_wrong_layout_is_recreated(self):
        segments.unlink_segment("stalegrp", "cpu0")
        path = segments.segment_path("stalegrp", "cpu0")
        path.write_bytes(b"garbage from an older, crashed run")
        path.chmod(0o600)  # ours, private: replaceable (a readable one is refused, below)
        stale = lease_lib.DeviceLease("stalegrp", "cpu0")
        stale.acquire()
        stale.yield_device()
        self.assertEqual(stale.stats().acquires, 1)
        self.assertGreater(path.stat().st_size, 64)
        segments.unlink_segment("stalegrp", "cpu0")


    def test_names_with_trailing_newline_rejected(self):
        for bad in ("grp\n", "grp\n\n", "\ngrp"):
            with self.assertRaisesRegex(ValueError, "invalid"):
                lease_lib.DeviceLease(bad, "cpu0")
            with self.assertRaisesRegex(ValueError, "invalid"):
                lease_lib.DeviceLease("grp", f"cpu0{bad}")

    def test_unbounded_timeouts_rejected_clearly(self):
        for bad in (float("inf"), float("nan"), 1e10, -1.0, 0):
            with self.assertRaisesRegex(ValueError, "timeout must be a number of seconds"):
                lease_lib.DeviceLease(self.group, "cpu0", timeout_s=bad)
        ops = lease_lib.load_library()
        for bad in (float("inf"), 1e10):
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "timeout"):
                ops.crossover_acquire_lease([], group=self.group, device_key="cpu0",
                                            timeout_seconds=bad)
        self.assertEqual(lease_lib.DeviceLease(self.group, "cpu0", 2.5e6).timeout_s, 2.5e6)

    def test_bad_priority_or_reservation_rejected_clearly(self):
        with self.assertRaisesRegex(ValueError, "priority must be one of"):
            lease_lib.DeviceLease(self.group, "cpu0", priority="high")
        for bad in (-1.0, float("inf"), lease_lib.MAX_RESERVE_S + 1):
            with self.assertRaisesRegex(ValueError, "reservation must be in"):
                lease_lib.validate_reserve(bad)
        self.assertEqual(lease_lib.validate_reserve(lease_lib.MAX_RESERVE_S),
                         lease_lib.MAX_RESERVE_S)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "reservation"):
            self.lease.yield_device(reserve_s=lease_lib.MAX_RESERVE_S + 1)  # the op's own bound

    def test_segment_readable_by_others_is_refused_not_deleted(self):
        path = segments.segment_path("opengrp", "cpu0")
        path.unlink(missing_ok=True)
        path.write_bytes(b"x")
        path.chmod(0o644)
        try:
            with self.assertRaisesRegex(tf.errors.PermissionDeniedError, "permissions 0644"):
                lease_lib.DeviceLease("opengrp", "cpu0").acquire()
            self.assertTrue(path.exists())
        finally:
            path.unlink(missing_ok=True)

    def test_stats_fields_come_from_the_op(self):
        self.lease.acquire()
        stats = self.lease.stats()
        self.assertTrue(stats.held)
        self.assertIsInstance(stats.acquires, int)
        self.assertEqual(stats.acquires, 1)
        with self.assertRaisesRegex(RuntimeError, "rebuild the op library"):
            lease_lib.LeaseStats.from_op_output(np.zeros(2), [b"acquires", b"bogus"])


def _spawn(child_env, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, WORKER, *args], env=child_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen, timeout: float = 60) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return out


def _wait_for(path: pathlib.Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} not written within {timeout} s"
        time.sleep(0.01)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_mutual_exclusion_and_alternation(tmp_path, lease_group, child_env):
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    barrier = f"{tmp_path / 'barrier'}:2"   # start cycling together, not a TF start-up apart
    procs = [_spawn(child_env, "cycles", lease_group, "cpu0", "40", "4", str(o), barrier)
             for o in outs]
    for p in procs:
        _finish(p)
    runs = [json.loads(o.read_text()) for o in outs]
    events = sorted((s, e, who) for who, r in enumerate(runs) for s, e in r["intervals"])
    for (s1, e1, w1), (s2, e2, w2) in zip(events, events[1:]):
        assert e1 <= s2, f"hold intervals overlap: {(s1, e1, w1)} and {(s2, e2, w2)}"
    # While both are cycling (both always want the device), ownership must alternate.
    both_start = max(r["intervals"][0][0] for r in runs)
    both_end = min(r["intervals"][-1][1] for r in runs)
    owners = [w for s, e, w in events if s >= both_start and e <= both_end]
    assert len(owners) >= 20, owners
    switches = sum(a != b for a, b in zip(owners, owners[1:]))
    assert switches >= 0.9 * (len(owners) - 1), f"no alternation: {owners}"
    for r in runs:
        assert r["stats"]["handoffs"] >= 15, r["stats"]
        assert r["stats"]["contended"] >= 15, r["stats"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sigkilled_holder_does_not_block_peer(tmp_path, lease_group, child_env):
    ready, result = tmp_path / "ready", tmp_path / "result.json"
    holder = _spawn(child_env, "hold", lease_group, "cpu0", str(ready))
    try:
        _wait_for(ready, 60)
        waiter = _spawn(child_env, "acquire", lease_group, "cpu0", "30", str(result))
        _wait_for(result.with_suffix(".started"), 60)   # TF imported, about to queue
        time.sleep(0.5)
        assert not result.exists(), "waiter acquired while the holder was alive"
        killed_ns = time.time_ns()
        holder.send_signal(signal.SIGKILL)   # not reaped yet: a zombie must count as dead
        _finish(waiter)
    finally:
        holder.kill()
        holder.wait()
    outcome = json.loads(result.read_text())
    assert "error" not in outcome, outcome
    latency_s = (outcome["acquired_ns"] - killed_ns) / 1e9
    assert 0 <= latency_s < 1.0, latency_s
    assert outcome["recoveries"] >= 1


@pytest.mark.multiprocess
@pytest.mark.slow
def test_acquire_timeout_names_group_and_holder(tmp_path, lease_group, child_env):
    ready = tmp_path / "ready"
    holder = _spawn(child_env, "hold", lease_group, "cpu0", str(ready))
    try:
        _wait_for(ready, 60)
        lease = lease_lib.DeviceLease(lease_group, "cpu0", timeout_s=0.5)
        start = time.monotonic()
        with pytest.raises(tf.errors.DeadlineExceededError) as err:
            lease.acquire()
        elapsed = time.monotonic() - start
        assert 0.5 <= elapsed < 3.0, elapsed
        message = str(err.value)
        assert lease_group in message and f"held by pid {holder.pid}" in message, message
        assert not lease.stats().held
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_holder_that_exited_without_release_is_reclaimed(tmp_path, lease_group, child_env):
    _finish(_spawn(child_env, "exit_holding", lease_group, "cpu0"))
    lease = lease_lib.DeviceLease(lease_group, "cpu0", timeout_s=5)
    start = time.monotonic()
    lease.acquire()
    assert time.monotonic() - start < 1.0
    assert lease.stats().recoveries >= 1
    lease.yield_device()


def test_stats_are_decoded_by_the_names_the_op_reports():
    """The C++ core names each value, so any order it emits decodes to the right fields."""
    names = [f.name for f in reversed(dataclasses.fields(lease_lib.LeaseStats))]
    values = np.arange(1, len(names) + 1, dtype=np.float64)
    stats = lease_lib.LeaseStats.from_op_output(values, [n.encode() for n in names])
    by_name = dict(zip(names, values))
    assert stats.acquires == by_name["acquires"] and isinstance(stats.acquires, int)
    assert stats.max_hold_s == by_name["max_hold_s"] and stats.held is True
    with pytest.raises(RuntimeError, match="rebuild the op library"):
        lease_lib.LeaseStats.from_op_output(values[:8], names[:8])
