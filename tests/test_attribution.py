"""Where a crossed round's time goes (attribute.py) and Horovod timeline steps, on hand-made
timelines whose answer is known."""
from __future__ import annotations

import json

import numpy as np
import pytest

from crossover_tf_planner.job_stats import JobStats
from experiments import attribute, horovod_timeline

MS = 1_000_000  # ns


def _job(name: str, events_ms: list[tuple[float, float, float, int]], step_ends_ms: list[float],
         compute_s: float, comm_s: float, apply_s: float = 0.0) -> JobStats:
    return JobStats(job=name, global_batch_size=8, steps=len(step_ends_ms),
                    timed_steps=len(step_ends_ms) - 1, step_time_s=0.1, images_per_s=80.0,
                    timed_wall_s=1.0, step_end_ns=[int(t * MS) for t in step_ends_ms],
                    lease_events_ns=[[int(r * MS), int(a * MS), int(e * MS), tag]
                                     for r, a, e, tag in events_ms],
                    compute_s=compute_s, comm_s=comm_s, apply_s=apply_s)


def _crossed_pair(steps: int = 6, gap_ms: float = 1.0, idle_ms: float = 0.0):
    """A computes 40 ms, hands over (gap_ms) to B, which computes 40 ms; each allreduce
    takes exactly the other's compute plus the gap (no apply), plus idle_ms where both are
    in their allreduce and nobody wants the device."""
    a_events, b_events = [], []
    period = 80 + 2 * gap_ms + idle_ms
    for k in range(steps + 1):  # the round after the last step end has begun, as in a run
        t = k * period
        a_events.append((t - gap_ms if k else t, t, t + 40, 1))
        b_start = t + 40 + gap_ms
        b_events.append((t + 40, b_start, b_start + 40, 1))
    a_ends = b_ends = [(k + 1) * period for k in range(steps)]  # both on round boundaries
    a = _job("A", a_events, a_ends, 0.040, 0.040)
    b = _job("B", b_events, b_ends, 0.040, 0.040)
    return {"A": a, "B": b}, period


def test_device_time_splits_holds_hand_offs_and_idle():
    jobs, period = _crossed_pair(gap_ms=1.0, idle_ms=5.0)
    events = {j: attribute.lease_events(s) for j, s in jobs.items()}
    split = attribute.device_time(events, int(period * MS), int(4 * period * MS))
    assert split["A compute"] == pytest.approx(3 * 0.040)
    assert split["B compute"] == pytest.approx(3 * 0.040)
    # B asks the moment A releases and gets it gap_ms later; A asks gap_ms before its turn.
    assert split["hand-off gaps"] == pytest.approx(3 * 2 * 0.001)
    assert split["idle"] == pytest.approx(3 * 0.005)
    assert sum(split.values()) == pytest.approx(3 * period / 1e3)


def test_round_loss_adds_up_to_its_causes():
    jobs, period = _crossed_pair(gap_ms=1.0, idle_ms=5.0)
    solo = {j: _job(j, [], [0, 1], 0.038, 0.040) for j in "AB"}  # holds 2 ms shorter alone
    out = attribute.attribute(jobs, solo, warmup_steps=1)
    assert out["round_ms"] == pytest.approx(period)
    assert out["ideal_round_ms"] == pytest.approx(80.0)  # max(38, 40) + max(38, 40)
    causes = out["loss_by_cause_ms"]
    assert causes["holds longer than solo (CPU contention)"] == pytest.approx(4.0)
    assert causes["hand-off gaps"] == pytest.approx(2.0)
    assert causes["idle beyond the ideal schedule's"] == pytest.approx(5.0 - 4.0)
    assert sum(causes.values()) == pytest.approx(out["loss_ms"])
    assert out["hand-offs_per_round"] == pytest.approx(2.0, abs=0.4)
    assert "hand-off gaps" in attribute.markdown({**out, "trial": 0})


def test_old_stats_without_events_are_rebuilt_from_phases():
    phases = [[0, 40 * MS, 70 * MS, 75 * MS, 78 * MS], [80 * MS, 120 * MS, 150 * MS, 152 * MS,
                                                        155 * MS]]
    stats = JobStats(job="A", global_batch_size=8, steps=2, timed_steps=1, step_time_s=0.08,
                     images_per_s=100.0, timed_wall_s=0.08, phases_ns=phases)
    events = attribute.lease_events(stats)
    assert events.tolist() == [[0, 0, 40 * MS, 1], [70 * MS, 75 * MS, 78 * MS, 2],
                               [78 * MS, 80 * MS, 120 * MS, 1], [150 * MS, 152 * MS, 155 * MS, 2]]


def _trace(steps: int, negotiate_us: float, transfer_us: float) -> list[dict]:
    """Two gradient tensors per step plus a metric reduced once, as Horovod writes them."""
    events = []
    for k in range(steps):
        t = k * 100_000.0
        for pid in (1, 2):
            ready = t + negotiate_us + pid  # the other rank arrives negotiate_us later
            events += [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": t + pid, "pid": pid},
                       {"ph": "X", "name": "1", "ts": ready, "pid": pid},
                       {"ph": "E", "ts": ready, "pid": pid},
                       {"ph": "B", "name": "ALLREDUCE", "ts": ready + 10, "pid": pid},
                       {"ph": "B", "name": "QUEUE", "ts": ready + 10, "pid": pid},
                       {"ph": "E", "ts": ready + 20, "pid": pid},
                       {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": ready + 20, "pid": pid},
                       {"ph": "E", "ts": ready + 20 + transfer_us, "pid": pid},
                       {"ph": "E", "ts": ready + 30 + transfer_us, "pid": pid}]
    for pid in (3, 7, 8):  # metrics averaged once: more tensors than the gradients
        events += [{"ph": "B", "name": "ALLREDUCE", "ts": 5.0, "pid": pid},
                   {"ph": "E", "ts": 6.0, "pid": pid}]
    for pid in (4, 5, 6):  # initial weights, broadcast once: no allreduce at all
        events += [{"ph": "B", "name": "BROADCAST", "ts": 1.0, "pid": pid},
                   {"ph": "E", "ts": 2.0, "pid": pid}]
    return events


def test_horovod_timeline_steps_split_waiting_from_transfer(tmp_path):
    rows = horovod_timeline.step_phases(_trace(4, negotiate_us=3000, transfer_us=20_000))
    assert len(rows) == 4
    assert rows[1]["negotiate_ms"] == pytest.approx(3.001)  # first ask -> last ready
    assert rows[1]["transfer_ms"] == pytest.approx(20.001)  # union of the two tensors'
    assert rows[1]["allreduce_ms"] == pytest.approx(20.021)  # first begin -> last end
    assert rows[1]["total_ms"] == pytest.approx(3.000 + 0.031 + 20.000)
    path = tmp_path / "timeline.json"
    text = json.dumps(_trace(4, 3000, 20_000))
    path.write_text(text[:-1])  # a writer killed before closing the array
    assert horovod_timeline.summary(path, skip_steps=1)["negotiate_ms"] == pytest.approx(3.001)
    with pytest.raises(ValueError, match="no allreduce steps"):
        horovod_timeline.summary(path, skip_steps=4)


def test_cache_hits_without_negotiation_count_as_no_wait():
    events = [e for e in _trace(3, 3000, 20_000)
              if not (e.get("name") == "NEGOTIATE_ALLREDUCE" and e["ts"] > 100_000)]
    rows = horovod_timeline.step_phases(events)
    assert rows[0]["negotiate_ms"] > 3 and rows[2]["negotiate_ms"] == 0.0
    assert np.isfinite([r["total_ms"] for r in rows]).all()
