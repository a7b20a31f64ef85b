"""The thread-CPU probe's accounting (experiments/probes/thread_cpu.py) on hand-written
`perf script` lines: who had the core during an interval, softirqs taken out of the thread
they interrupted, and the parts adding up to the interval."""
from __future__ import annotations

import pytest

from experiments.probes import thread_cpu

SWITCH = ("{comm:>12} {pid}/{tid} [000] {t:.6f}: sched:sched_switch: prev_comm={comm} "
          "prev_pid={tid} prev_prio=120 prev_state=S ==> next_comm={next_comm} "
          "next_pid={next_tid} next_prio=120")
SOFTIRQ = "{comm:>12} {pid}/{tid} [000] {t:.6f}: irq:softirq_{edge}: vec=3 [action=NET_RX]"
# On cpu 0: idle until 1.0; job A's compute thread (pid 100) until 1.5, hit by a 10 ms NET_RX
# softirq at 1.1; job B's Horovod thread (pid 200, its first thread after the main one)
# until 1.6; idle until 2.0.
LINES = [
    SWITCH.format(comm="swapper/0", pid=0, tid=0, t=1.0, next_comm="tf_Compute", next_tid=101),
    SOFTIRQ.format(comm="tf_Compute", pid=100, tid=101, t=1.1, edge="entry"),
    SOFTIRQ.format(comm="tf_Compute", pid=100, tid=101, t=1.11, edge="exit"),
    SWITCH.format(comm="tf_Compute", pid=100, tid=101, t=1.5, next_comm="hvd_bg",
                  next_tid=201),
    SWITCH.format(comm="hvd_bg", pid=200, tid=201, t=1.6, next_comm="swapper/0", next_tid=0),
    SWITCH.format(comm="swapper/0", pid=0, tid=0, t=2.0, next_comm="tf_Compute", next_tid=101),
    "a line that is no event",
]


def test_an_interval_splits_into_the_threads_softirqs_and_idle_that_had_the_core():
    slices = thread_cpu.parse_perf(LINES)
    assert list(slices) == [0]
    shares = thread_cpu.split_interval(slices[0], 1.0, 2.0, {100: "own", 200: "peer B"})
    assert dict(shares) == pytest.approx({"own/tf_Compute": 0.49, "softirq/NET_RX": 0.01,
                                          "peer B/hvd_bg #1": 0.1, "idle": 0.4})
    assert sum(shares.values()) == pytest.approx(1.0)
    part = thread_cpu.split_interval(slices[0], 1.4, 1.55, {100: "own"})
    assert dict(part) == pytest.approx({"own/tf_Compute": 0.1, "other/hvd_bg": 0.05})


@pytest.mark.parametrize("name, kind", [("tf_Compute", "tf_Compute"), ("python3", "python"),
                                        ("grpc_global_tim", "grpc_global_tim"),
                                        ("kworker/1:1", "kworker")])
def test_pool_members_share_one_kind(name, kind):
    assert thread_cpu.thread_group(name) == kind
