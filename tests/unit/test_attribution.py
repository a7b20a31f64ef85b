"""Where a crossed round's time goes (attribute.py) and Horovod timeline steps, on hand-made
timelines whose answer is known."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from crossover_tf_planner.job_stats import JobStats
from crossover_tf_planner.compare_record import Comparison
from experiments.analysis import attribute, horovod_timeline

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


def test_idle_while_a_job_is_between_its_steps_is_told_apart():
    """A applies at 80-82 ms and asks for its next compute at 90: the 8 ms between, with B in
    its allreduce, are the steps' Python; 100-105, with both in their allreduces, plain idle."""
    a = np.array([[0, 0, 40, 1], [80, 80, 82, 2], [90, 90, 100, 1]]) * [MS, MS, MS, 1]
    b = np.array([[40, 40, 80, 1], [105, 105, 120, 1]]) * [MS, MS, MS, 1]
    split = attribute.device_time({"A": a, "B": b}, 0, 120 * MS)
    assert split[attribute.IDLE_BETWEEN_STEPS] == pytest.approx(0.008)
    assert split["idle"] == pytest.approx(0.005)
    assert split["A apply"] == pytest.approx(0.002)
    assert sum(split.values()) == pytest.approx(0.120)


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
    assert causes["idle between a job's steps (its Python)"] == 0.0  # no applies here
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


def _ranked(name: str, rank: int, arrive_ms: list[float], end_ms: list[float]) -> JobStats:
    """A rank whose allreduce k runs from arrive_ms[k] to end_ms[k] (20 ms compute before,
    5 ms apply after)."""
    phases = [[int((a - 20) * MS), int(a * MS), int(e * MS), int(e * MS), int((e + 5) * MS)]
              for a, e in zip(arrive_ms, end_ms)]
    return JobStats(job=name, rank=rank, size=2, global_batch_size=8, steps=len(phases),
                    timed_steps=len(phases) - 1, step_time_s=0.1, images_per_s=80.0,
                    timed_wall_s=1.0, phases_ns=phases, step_end_ns=[p[4] for p in phases])


def test_allreduce_split_separates_waiting_for_the_other_host_from_the_transfer():
    """Rank 0 arrives at 100 ms steps; rank 1 arrives 30 ms later; the allreduce ends 50 ms
    after that: 80 ms on rank 0, of which 30 waiting and 50 after the last arrival."""
    arrive0 = [100.0 * k for k in range(5)]
    arrive1 = [a + 30 for a in arrive0]
    ends = [a + 50 for a in arrive1]
    ranks = [_ranked("A", 0, arrive0, ends), _ranked("A", 1, arrive1, ends)]
    split = attribute.allreduce_split(ranks, warmup_steps=1)
    assert split == pytest.approx({"total_ms": 80.0, "wait_for_last_rank_ms": 30.0,
                                   "after_last_rank_ms": 50.0})
    # Seen from rank 1, nobody is waited for: the whole allreduce comes after its own arrival.
    assert attribute.allreduce_split(ranks[::-1], 1)["wait_for_last_rank_ms"] == 0.0
    with pytest.raises(ValueError, match="every rank's timeline"):
        attribute.allreduce_split(ranks[:1], 1)
    with pytest.raises(ValueError, match="no step after warm-up"):
        attribute.allreduce_split(ranks, warmup_steps=5)


def test_comparison_attribution_reads_every_ranks_saved_record(tmp_path):
    """from_comparison finds the other ranks' stats.rank<r>.json where train.py writes them
    (tensorboard/t<trial>_<scenario>/<job>/) and splits solo and crossed allreduces."""
    from experiments import train
    jobs, _ = _crossed_pair()
    arrive = [100.0 * k for k in range(6)]
    solo_ranks = {j: [_ranked(j, 0, arrive, [a + 40 for a in arrive]),
                      _ranked(j, 1, arrive, [a + 40 for a in arrive])] for j in "AB"}
    crossed_rank0 = {j: _ranked(j, 0, arrive, [a + 90 for a in arrive]) for j in "AB"}
    crossed_rank1 = {j: _ranked(j, 1, [a + 35 for a in arrive], [a + 90 for a in arrive])
                     for j in "AB"}
    for job in "AB":  # the round attribution reads rank 0's events; the split its phases
        crossed_rank0[job] = dataclasses.replace(
            crossed_rank0[job], lease_events_ns=jobs[job].lease_events_ns,
            step_end_ns=jobs[job].step_end_ns, compute_s=0.04, comm_s=0.04, apply_s=0.0)
        solo_ranks[job][0] = dataclasses.replace(solo_ranks[job][0], compute_s=0.04, comm_s=0.04,
                                                 apply_s=0.0)
        for scenario, stats in (("sequential", solo_ranks[job][1]),
                                ("crossover", crossed_rank1[job])):
            job_dir = tmp_path / "tensorboard" / f"t0_{scenario}" / job
            job_dir.mkdir(parents=True)
            stats.to_json(job_dir / train.stats_file_name(1))
    result = {"settings": {"warmup_steps": 1}, "scenarios": {
        "crossover": {"jobs": {j: crossed_rank0[j].to_dict() for j in "AB"}},
        **{f"solo_{j}": {"jobs": {j: solo_ranks[j][0].to_dict()}} for j in "AB"}}}
    result = Comparison.from_dict(result)
    out = attribute.from_comparison(result, out_dir=tmp_path)
    assert out["allreduce_split"]["A"]["solo"] == pytest.approx(
        {"total_ms": 40.0, "wait_for_last_rank_ms": 0.0, "after_last_rank_ms": 40.0})
    assert out["allreduce_split"]["B"]["crossed"] == pytest.approx(
        {"total_ms": 90.0, "wait_for_last_rank_ms": 35.0, "after_last_rank_ms": 55.0})
    assert "| B | crossed | 90.0 | 35.0 | 55.0 |" in attribute.markdown(out)
    assert train.stats_file_name(0) == "stats.json"
    assert "allreduce_split" not in attribute.from_comparison(result, out_dir=tmp_path / "x")


def test_allreduce_overlap_on_the_link():
    """A's allreduces run [0, 60) ms of each 100 ms, B's [30, 90): each overlapped half its
    time, and some allreduce is in flight 90 ms of every 100."""
    arrive = [100.0 * k for k in range(5)]
    jobs = {"A": _ranked("A", 0, arrive, [a + 60 for a in arrive]),
            "B": _ranked("B", 0, [a + 30 for a in arrive], [a + 90 for a in arrive])}
    out = attribute.allreduce_overlap(jobs, 0, 500 * MS)
    assert out["in_flight_s"] == pytest.approx(0.450)
    assert out["overlapped_fraction"] == pytest.approx({"A": 0.5, "B": 0.5})
    # The window cuts the spans: in [0, 45) only A's first allreduce and 15 ms of B's run.
    assert attribute.allreduce_overlap(jobs, 0, 45 * MS)["overlapped_fraction"] == \
        pytest.approx({"A": 15 / 45, "B": 1.0})
    assert attribute.allreduce_overlap(_crossed_pair()[0], 0, 500 * MS) == {}


def test_allreduce_spans_of_a_job_in_link_turns_are_its_turns():
    """With turns, a rank's time between compute and apply also holds its wait for the other
    job's allreduce: the overlap is measured on the turns themselves, which never overlap."""
    arrive = [100.0 * k for k in range(5)]
    jobs = {"A": _ranked("A", 0, arrive, [a + 80 for a in arrive]),
            "B": _ranked("B", 0, [a + 30 for a in arrive], [a + 90 for a in arrive])}
    assert attribute.allreduce_overlap(jobs, 0, 500 * MS)["overlapped_fraction"]["B"] == \
        pytest.approx(5 / 6)
    turns = {"A": [[int(a * MS), int(a * MS), int((a + 40) * MS), 0] for a in arrive],
             "B": [[int((a + 30) * MS), int((a + 40) * MS), int((a + 90) * MS), 0]
                   for a in arrive]}
    for job, events in turns.items():
        jobs[job] = dataclasses.replace(jobs[job], turn_events_ns=events)
    np.testing.assert_array_equal(attribute.allreduce_spans(jobs["B"])[0], [40 * MS, 90 * MS])
    out = attribute.allreduce_overlap(jobs, 0, 500 * MS)
    assert out["overlapped_fraction"] == pytest.approx({"A": 0.0, "B": 0.0})
    assert out["in_flight_s"] == pytest.approx(0.450)


def test_every_trial_gets_its_own_row_of_causes():
    """The representative trial alone can hide a trial whose holds ran long: each trial's
    loss is split against its own solo runs, and a trial without a crossed step says so."""
    jobs, period = _crossed_pair(gap_ms=1.0, idle_ms=5.0)

    def trial(solo_compute_s: float) -> dict:
        return {"scenarios": {
            "crossover_turn": {"jobs": {j: s.to_dict() for j, s in jobs.items()}},
            **{f"solo_{j}": {"jobs": {j: _job(j, [], [0, 1], solo_compute_s, 0.040).to_dict()}}
               for j in "AB"}}}
    late = _crossed_pair(steps=1)[0]  # one step: nothing whole after the warm-up
    broken = {"scenarios": {**trial(0.040)["scenarios"], "crossover_turn": {
        "jobs": {j: s.to_dict() for j, s in late.items()}}}}
    result = Comparison.from_dict({"settings": {"warmup_steps": 1}, **trial(0.038),
                                   "per_trial": [trial(0.038), trial(0.030), broken]})
    out = attribute.from_comparison(result, scenario="crossover_turn")
    rows = out["every_trial"]
    contention = "holds longer than solo (CPU contention)"
    assert [r["loss_by_cause_ms"][contention] for r in rows[:2]] == pytest.approx([4.0, 20.0])
    assert rows[1]["round_ms"] == pytest.approx(period)
    assert rows[2]["trial"] == 2 and "overlap" in rows[2]["error"]
    table = attribute.markdown(out)
    assert "| 1 | 87.0 | 80.0 | 7.0 | +20.0 |" in table
    assert "| median | 87.0 |" in table
