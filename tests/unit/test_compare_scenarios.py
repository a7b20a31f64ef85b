"""The comparison's summaries of N jobs and of the priority scenario, the replanned
predictions, and the measured verdicts' intervals (experiments/comparison/summary.py,
experiments/analysis/intervals.py)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from crossover_tf_planner.job_stats import JobStats
from experiments import compare
from experiments.analysis import intervals, report
from experiments.comparison import scenarios, trials
from experiments.comparison import summary as summary_lib
from crossover_tf_planner.compare_record import Comparison, Interval
from compare_fakes import job_stats

pytestmark = pytest.mark.usefixtures("compare_flags")


# -- N jobs and the priority scenario -------------------------------------------------------------
def test_three_job_summary_reports_every_job_and_the_fifo_ideal(tmp_path):
    jobs = "ABC"
    solo = 0.1 + 0.2  # C = 100 ms (+10% apply), M = 200 ms: M/C about 2
    stats = {"sequential": {j: job_stats(j, solo, 0.1, 0.2) for j in jobs},
             "naive": {j: job_stats(j, 3 * solo / 1.3, 0.1, 0.2) for j in jobs},
             "crossover": {j: job_stats(j, 3 * solo / 1.4, 0.1, 0.2) for j in jobs}}
    summary = summary_lib.summarise(stats, 1, {})
    assert {f"solo_{j}" for j in jobs} <= set(summary.scenarios)
    assert summary.ratios["crossover_over_sequential"] == pytest.approx(1.4, rel=0.02)
    assert summary.ratios["crossover_over_naive"] == pytest.approx(1.4 / 1.3, rel=0.02)
    # FIFO bound: three links' worth of M (0.6 s) per round against the sequential run's
    # 3 x 0.3 s mean steps (the rate the measured ratios divide by; the phases' 0.31 s no longer
    # stands in for the step).
    assert summary.ratios["ideal_crossover_over_sequential"] == pytest.approx(0.9 / 0.6)
    assert summary.ideal.bound_by == "link" and summary.ideal.round_s == pytest.approx(0.6)
    assert trials.comm_to_compute(summary) == pytest.approx(0.2 / 0.11)
    table = report.markdown(summary)
    assert "| scenario | job A images/s | job B images/s | job C images/s |" in table
    assert "| C | 110.0 | 200.0 | 300.0 |" in table
    leased = stats["crossover"]
    report.plot(summary, leased, str(tmp_path / "three.png"))
    assert (tmp_path / "three.png").stat().st_size > 10_000


def _leased(job: str, priority: str, holds_ms: list[tuple[float, float, float]], period_s: float,
            steps: int = 10, tag: int = 1) -> JobStats:
    """A job whose lease events repeat `holds_ms` (request, acquired, released; ms into each
    step) every step, with one apply event per step."""
    events = []
    for i in range(steps):
        base = 1e9 * i * period_s
        events += [[int(base + 1e6 * t) for t in hold] + [tag] for hold in holds_ms]
    stats = job_stats(job, period_s, 0.05, 0.05, steps=steps)
    return dataclasses.replace(stats, priority=priority, lease_events_ns=events,
                               micro_batches=len(holds_ms))


def test_priority_ratios_judge_the_primary_against_solo_and_its_wait_against_a_micro_batch():
    from experiments.analysis import priority_metrics
    # The primary waits 3 ms for its compute hold, 1 ms for another; the secondary's four
    # micro-batches hold 5 ms each.
    primary = _leased("A", "primary", [(0, 3, 40), (60, 61, 70)], 0.1)
    secondary = _leased("B", "secondary", [(0, 0, 5), (10, 10, 15), (20, 20, 25), (30, 30, 35)],
                        0.1)
    solo = {"A": job_stats("A", 0.095, 0.05, 0.04), "B": job_stats("B", 0.1, 0.05, 0.05)}
    ratios = priority_metrics.priority_ratios(
        {"A": primary, "B": secondary}, solo, {"A": 320.0, "B": 100.0}, {"A": 200.0, "B": 200.0},
        warmup_steps=1)
    assert ratios["primary_over_solo"] == pytest.approx(320.0 / (32 / 0.095))
    assert ratios["secondary_over_naive"] == pytest.approx(0.5)
    assert ratios["primary_over_naive"] == pytest.approx(1.6)
    assert ratios["primary_max_wait_s"] == pytest.approx(0.003)
    assert ratios["secondary_micro_batch_s"] == pytest.approx(0.005)
    assert ratios["primary_max_wait_over_micro_batch"] == pytest.approx(0.6)
    # Warm-up events do not count: a 50 ms wait in step 0 is ignored.
    slow_start = dataclasses.replace(primary, lease_events_ns=[[0, int(50e6), int(60e6), 1]]
                                     + primary.lease_events_ns[2:])
    assert priority_metrics.priority_ratios(
        {"A": slow_start, "B": secondary}, solo, {"A": 1.0, "B": 1.0}, None, 1
    )["primary_max_wait_s"] == pytest.approx(0.003)
    with pytest.raises(ValueError, match="one primary"):
        priority_metrics.priority_ratios({"A": secondary, "B": secondary}, solo,
                                         {"A": 1.0, "B": 1.0}, None, 1)


def test_saved_lease_tags_match_the_lease_library():
    from crossover_tf import lease
    from crossover_tf_planner import job_stats
    assert job_stats.LEASE_TAGS == {lease.TAG_OTHER: "other", lease.TAG_COMPUTE: "compute",
                                    lease.TAG_APPLY: "apply"}
    assert job_stats.TAG_COMPUTE == lease.TAG_COMPUTE


def test_priority_scenario_summary_and_report(tmp_path):
    # 20 steps each: the secondary completes 8 inside the window (the guard asks for 5).
    primary = _leased("A", "primary", [(0, 3, 40), (60, 61, 70)], 0.1, steps=20)
    secondary = _leased("B", "secondary", [(0, 0, 5), (10, 10, 15)], 0.2, steps=20)
    stats = {"sequential": {"A": job_stats("A", 0.095, 0.05, 0.04),
                            "B": job_stats("B", 0.1, 0.05, 0.05)},
             "naive": {j: job_stats(j, 0.15, 0.05, 0.05) for j in "AB"},
             "priority": {"A": primary, "B": secondary}}
    summary = summary_lib.summarise(stats, 1, {})
    assert "crossover_over_naive" not in summary.ratios  # crossover did not run
    assert summary.ratios["primary_over_solo"] == pytest.approx(
        summary.scenarios["priority"].per_job_in_aggregate["A"] / (32 / 0.095))
    table = report.markdown(summary)
    assert "(primary)" in table and "(secondary)" in table
    assert "| priority: primary's worst wait (s) | 0.003 |" in table
    report.plot(summary, stats["priority"], str(tmp_path / "priority.png"))
    assert (tmp_path / "priority.png").stat().st_size > 10_000


def test_scenario_job_settings_mark_the_primary_and_split_the_secondary():
    assert scenarios.job_names(3) == ("A", "B", "C")
    with pytest.raises(ValueError, match="1..4 jobs"):
        scenarios.job_names(5)
    two = {"group_jobs": 2}  # every job of a concurrent scenario declares the group's count
    assert scenarios.job_settings("crossover", "AB", 4) == {"A": two, "B": two}
    assert scenarios.job_settings("sequential", "AB", 4) == {"A": {"group_jobs": 1},
                                                             "B": {"group_jobs": 1}}
    assert scenarios.job_settings("priority", "AB", 4) == {
        "A": {"priority": "primary", **two},
        "B": {"priority": "secondary", "micro_batches": 4, **two}}
    c = compare.config_lib.resolve(compare.flags.FLAGS, compare.FLAG_NAMES,
                                   {"out_dir": "x", "bandwidth_mbit": 10.0}, compare.validate,
                                   "compare")
    argv = scenarios.train_command(c, "B", "g", "d", "", extra={"priority": "secondary",
                                                               "micro_batches": 4})
    assert "--priority=secondary" in argv and "--micro_batches=4" in argv


@pytest.mark.parametrize("overrides, message", [
    ({"jobs": 5}, "jobs must be in 2..4"),
    ({"jobs": 3, "scenarios": ["sequential", "priority"]}, "--jobs=2"),
    ({"secondary_micro_batches": 5}, "must divide each rank's batch"),
    ({"jobs": 3, "sweep_comm_to_compute": ["1"]}, "--jobs=2"),
])
def test_compare_rejects_bad_job_settings(overrides, message):
    with pytest.raises(ValueError, match=message):
        compare.config_lib.resolve(compare.flags.FLAGS, compare.FLAG_NAMES, overrides,
                                   compare.validate, "compare")


def test_replan_rewrites_predictions_from_saved_comparisons(fake_runs, tmp_path):
    from experiments import replan
    compare.run(overrides={"sweep_comm_to_compute": ["0.5", "2"], "out_dir": str(tmp_path)})
    before = json.loads((tmp_path / "ratio_2" / "compare.json").read_text())
    measured = before["ratios"]
    costly = {"cpu_per_wait_s": 0.5, "cpu_s_per_mb": 0.0}
    rows = replan.replan(tmp_path, costly)
    after = json.loads((tmp_path / "ratio_2" / "compare.json").read_text())
    assert after["ratios"] == measured  # measurements untouched
    assert after["regime"]["comm_cpu"] == costly
    assert after["planner"]["profiles"][0]["comm_cpu_s"] == pytest.approx(
        0.5 * after["planner"]["profiles"][0]["comm_s"])
    assert [r["comm_to_compute_asked"] for r in rows] == [0.5, 2.0]
    assert json.loads((tmp_path / "sweep.json").read_text())["rows"] == rows
    assert ("Planner (from the solo runs and the comm-CPU and link-contention probes"
            in (tmp_path / "ratio_2" / "compare.md").read_text())
    with pytest.raises(ValueError, match="no compare.json"):
        replan.replan(tmp_path / "nowhere")


def _interval(low: float, high: float) -> Interval:
    return Interval(low, high, 0.95, 3, 2000, "hand-made")


def _hand_made(result: dict) -> Comparison:
    """A hand-made comparison's JSON as the record (its intervals given by their ends)."""
    found = {k: _interval(**i) for k, i in result.pop("ratio_interval").items()}
    return dataclasses.replace(Comparison.from_dict({"scenarios": {}, **result}),
                               ratio_interval=found)


def test_measured_verdict_follows_the_interval_not_a_silent_bar():
    """The issue's M/C 0.97 page: crossover / naive 1.046, crossing faster in every trial,
    yet "naive" won because 1.046 < 1.05, a bar the page never stated. Now the interval
    decides: above 1.01 a win, including 1.0 a tie, above 1.0 by less a close call; the
    faster policy of each trial is counted beside it (no bar)."""
    per_trial = [{"ratios": {"naive_over_sequential": naive, "crossover_over_sequential": cross},
                  "planner": {"recommendation": {"predicted": "naive"}}}
                 for naive, cross in ((1.513, 1.594), (1.358, 1.446), (1.509, 1.420))]
    result = {"ratios": {"naive_over_sequential": 1.509, "crossover_over_sequential": 1.446,
                         "crossover_over_naive": 1.046}, "per_trial": per_trial,
              "ratio_interval": {"naive_over_sequential": {"low": 1.40, "high": 1.55},
                                 "crossover_over_naive": {"low": 1.012, "high": 1.081}}}
    result = _hand_made(result)
    chosen = trials.verdict(result)
    assert chosen["predicted"] == "naive" and chosen["measured_winner"] == "cross"
    assert chosen["trial_winners"] == {"cross": 2, "naive": 1}
    assert [s["call"] for s in chosen["steps"]] == ["win", "win"]
    assert trials.verdict_cells(chosen) == (
        "naive", "cross (naive / sequential 1.509 [95% 1.400–1.550]: win; crossover / naive "
                 "1.046 [95% 1.012–1.081]: win; faster per trial: cross 2, naive 1)")
    for low, high, call in ((0.99, 1.07, "tie"), (1.003, 1.009, "too close to call")):
        result.ratio_interval["crossover_over_naive"] = _interval(low, high)
        chosen = trials.verdict(result)
        assert chosen["measured_winner"] == "naive" and chosen["steps"][-1]["call"] == call
    result = dataclasses.replace(result, ratio_interval={})  # no interval: the median stands in
    chosen = trials.verdict(result)
    assert chosen["measured_winner"] == "cross" and not chosen["steps"][-1]["interval"]
    assert "crossover / naive 1.046 [no interval]: win" in trials.verdict_cells(chosen)[1]
    assert trials.verdict_cells({"predicted": "naive"}) == ("naive", "—")


def test_interval_calls():
    assert intervals.call(1.012, 1.08) == "win"
    assert intervals.call(0.99, 1.07) == "tie"
    assert intervals.call(1.003, 1.07) == "too close to call"
    assert intervals.call(0.90, 0.98) == "loss"
    assert intervals.describe(_interval(0.99, 1.07)) == "0.990–1.070 (tie)"
    assert intervals.describe(None) == "—"


