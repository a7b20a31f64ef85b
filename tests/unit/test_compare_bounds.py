"""Per-trial sanity bounds, the one recommendation and the per-trial regime
(experiments/analysis/bounds.py, planning.py, the drift probe), on hand-made stats."""
from __future__ import annotations

import dataclasses
import json
import re

import pytest

from crossover_tf_planner import registry
from crossover_tf_planner.job_stats import JobStats
from experiments import compare
from experiments.analysis import bounds, report
from experiments.analysis import planning
from experiments.comparison import calibrate, scenarios, trials
from experiments.comparison import summary as summary_lib
from crossover_tf_planner.compare_record import Regime
from conftest import DATA
from compare_fakes import DRIFT_RUNS, FakeCluster, job_stats, scenario_stats, trial_results

pytestmark = pytest.mark.usefixtures("compare_flags")


# -- per-trial sanity bounds ----------------------------------------------------------------------
MAIN_JOB = ("sequential", "naive", "crossover", "crossover_turn")


def _slowed(stats: JobStats, factor: float) -> JobStats:
    """The same job with every step and phase `factor` times as long (a busy machine)."""
    return job_stats(stats.job, factor * stats.step_time_s, factor * stats.compute_s,
                  factor * stats.comm_s)


def _judged_trials(speedups: list[float], slowed: dict[int, float]) -> list:
    """The main job's scenarios per trial (crossover at `speedups[t]` times sequential), the
    sequential runs of the trials in `slowed` that many times slower; each summary judged by
    the bounds and checked by the planner, as compare_at does."""
    judged = []
    for trial, speedup in enumerate(speedups):
        stats = {n: s for n, s in scenario_stats(0.1, 0.1, speedup).items() if n in MAIN_JOB}
        if trial in slowed:
            stats["sequential"] = {j: _slowed(s, slowed[trial])
                                   for j, s in stats["sequential"].items()}
        judged.append(planning.with_planner(
            bounds.judge(summary_lib.summarise(stats, 1, {"trial": trial}))))
    return judged


def test_a_trial_beyond_its_solo_runs_is_refused_with_its_numbers_and_left_out(tmp_path):
    """The issue's trial 2, by hand: its sequential run 1.678x slow, so naive / sequential
    2.014 and crossover with link turns / sequential 2.423 (measured / ideal 1.27), beside
    three ordinary trials. Jobs together never beat each alone: its sequential is refused with
    the bound and the numbers, and every ratio over it leaves the medians, intervals, verdict,
    representative trial and planner's checks; its ratios among concurrent scenarios stay."""
    speedups = [1.2, 1.6, 2.423 / (1.15 * 1.678), 1.5]
    per_trial = _judged_trials(speedups, {2: 1.678})
    bad = per_trial[2]
    reason = bad.invalid["sequential"]
    assert re.search(r"crossover_turn ran at [\d.]+ images/s, 21\.2% above its jobs' solo rates "
                     r"summed \(A [\d.]+ \+ B [\d.]+ = [\d.]+\), crossover_turn / sequential "
                     r"2\.423", reason), reason
    assert "beyond the 5% allowed for noise" in reason and "were slowed" in reason
    assert "naive ran at" not in reason  # 2.014: 0.7% above the sum, inside the tolerance
    assert "sequential" not in bad.scenarios and {"solo_A", "solo_B"} <= set(bad.scenarios)
    assert not set(registry.ON_SEQUENTIAL) & set(bad.ratios)
    assert bad.ratios["crossover_turn_over_naive"] == pytest.approx(2.423 / 2.014, rel=1e-3)
    assert bad.planner is None  # its solo runs, the planner's inputs, were slowed
    assert all(t.invalid == {} for i, t in enumerate(per_trial) if i != 2)

    combined = planning.plan_trials(trials.combine(per_trial))
    assert [(e.trial, e.reason) for e in combined.invalid["sequential"]] == [(2, reason)]
    naive = combined.ratio_spread["naive_over_sequential"]
    assert naive.values == pytest.approx([1.2] * 3) and naive.of_trials == 4
    turn = combined.ratio_spread["crossover_turn_over_sequential"]
    assert turn.values == pytest.approx([1.15 * s for i, s in enumerate(speedups) if i != 2])
    assert combined.ratios["crossover_turn_over_sequential"] == pytest.approx(1.15 * 1.5)
    assert combined.ratio_interval["crossover_turn_over_sequential"].trials == 3
    assert combined.ratio_interval["crossover_turn_over_sequential"].high < 2
    assert len(combined.ratio_spread["crossover_turn_measured_over_ideal"].values) == 3
    assert combined.ratio_interval["crossover_over_naive"].trials == 4  # never over it
    assert not combined.checks
    assert sum(trials.verdict(combined)["trial_winners"].values()) == 3
    # Trial 2 had the lower median crossover / naive; the trial shown is one that stands.
    assert combined.representative_trial == 3 and combined.planner is not None
    table = report.markdown(combined)
    assert "**Outside the sanity bounds**" in table and "**Invalid scenarios**" not in table
    assert f"- sequential (trial 2): {reason}" in table
    assert "| crossover with link turns / sequential | 1.725 [1.380–1.840] (3 of 4 trials) |" \
        in table
    assert "trial 2 " not in table.split("Its pick checked in each trial")[1]
    report.plot(combined, combined.scenarios["crossover"].jobs, str(tmp_path / "c.png"))


def test_a_normal_trial_passes_the_bounds_and_the_tolerance_is_5_percent():
    """An ordinary trial is left as it is; a concurrent scenario 4% above its jobs' solo rates
    summed is noise, 6% above is not."""
    normal = summary_lib.summarise(scenario_stats(0.1, 0.1, 1.5), 1, {"trial": 0})
    assert bounds.judge(normal) is normal
    for over_sum, refused in ((1.04, False), (1.06, True)):
        stats = {n: s for n, s in scenario_stats(0.1, 0.1, 2 * over_sum).items()
                 if n in ("sequential", "naive", "crossover")}
        judged = bounds.judge(summary_lib.summarise(stats, 1, {}))
        assert ("sequential" in judged.invalid) == refused
        assert ("crossover_over_sequential" in judged.ratios) != refused


def test_compare_refuses_the_sequential_run_of_a_slowed_trial(fake_runs, monkeypatch, tmp_path):
    """compare.py judges every trial: a busy machine during trial 1's sequential run (1.5x
    slow) leaves that trial's ratios over sequential out of compare.json and says why."""
    fake = scenarios.run_scenario

    def busy_sequential(cluster, c, name, out, run_name="", jobs=("A", "B"), steps=None):
        stats = fake(cluster, c, name, out, run_name, jobs, steps)
        return ({j: _slowed(s, 1.5) for j, s in stats.items()} if run_name == "t1_sequential"
                else stats)

    monkeypatch.setattr(scenarios, "run_scenario", busy_sequential)
    compare.run(overrides={"comm_to_compute": 2.0, "trials": 3, "out_dir": str(tmp_path)})
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert [e["trial"] for e in saved["invalid"]["sequential"]] == [1]
    assert "crossover ran at" in saved["invalid"]["sequential"][0]["reason"]
    assert saved["ratio_spread"]["crossover_over_sequential"]["values"] == pytest.approx(
        [1.4, 1.2])
    assert saved["ratio_spread"]["crossover_over_naive"]["values"] == pytest.approx(
        [1.4 / 1.2, 1.6 / 1.2, 1.2 / 1.2])
    assert "- sequential (trial 1): crossover ran at" in (tmp_path / "compare.md").read_text()


def test_one_trial_above_its_ideal_beyond_its_interval_is_flagged_by_name():
    """Crossover at 1.98x sequential in trial 1 of 3: above its ideal (1.909x here, the device
    bounding the round) beyond its own interval, yet inside the solo runs' sum, so flagged, not
    refused; the median's interval stays below 1, so the check over all trials alone missed
    it. The other trials are not flagged."""
    per_trial = [bounds.judge(summary_lib.summarise(
        {n: s for n, s in scenario_stats(0.1, 0.1, speedup).items()
         if n in ("sequential", "naive", "crossover")}, 1, {"trial": trial}))
        for trial, speedup in enumerate([1.5, 1.98, 1.4])]
    assert all(t.invalid == {} for t in per_trial)
    combined = trials.combine(per_trial)
    assert not trials.above_ideal(combined.ratio_spread, combined.ratio_interval)
    assert combined.checks == [
        "trial 1: crossover / sequential is above its ideal (measured / ideal 1.037; this "
        "trial's 95% interval 1.037–1.037 lies wholly above 1): the measurement or the bound "
        "is wrong; do not trust trial 1's crossover ratios"]
    assert f"**Check failed:** {combined.checks[0]}" in report.markdown(combined)


RECOMMENDATION_LINE = re.compile(r"\brecommended\b", re.IGNORECASE)


def test_a_report_gives_one_recommendation_and_checks_every_trial():
    """The issue's report: the planner's block (trial 0) said "Recommended: cross" while the
    summary over 4 trials said "recommended naive" (the most frequent over the trials). Now the
    recommendation is the planner's from the shown trial's solo runs, given in one line; every
    trial's own pick is a check, labelled so."""
    per_trial = trial_results([1.3, 1.5, 1.2, 1.4])
    shown = trials.representative_trial(per_trial)
    per_trial = [dataclasses.replace(t, planner={**t.planner, "recommendation": {
        "predicted": "cross" if i == shown else "naive", "measured_winner": "cross"}})
        for i, t in enumerate(per_trial)]
    combined = trials.combine(per_trial)
    combined = dataclasses.replace(combined, planner=per_trial[shown].planner)
    table = report.markdown(combined)
    lines = [line for line in table.splitlines() if RECOMMENDATION_LINE.search(line)]
    assert len(lines) == 1 and lines[0].startswith("Over all 4 trial(s): recommended **cross**")
    assert trials.verdict(combined)["predicted"] == "cross"
    assert (f"trial {shown} cross against cross" in table
            and "naive against cross" in table and "(1 of 4 agree)" in table)
    assert f"the solo runs are trial {shown}'s" in table
    saved = (DATA / "compare_v1" / "compare.md").read_text()
    assert len([line for line in saved.splitlines() if RECOMMENDATION_LINE.search(line)]) == 1


def test_each_trials_regime_is_tabulated_and_marked_when_it_drifts():
    """Issue 39's run: the solo step grew trial by trial (C from 0.5 s to 0.85 s) while M
    stayed at 0.5 s, so M/C fell from about 1 to 0.54. Before: nothing in compare.md showed it,
    and the calls rested on every trial. Now each trial's link, solo step, C, M and M/C are in
    one table, a trial more than 15% off the asked-for M/C is marked, its ratios leave the
    calls (which rest on the one trial in the regime), and the verdict says so."""
    from experiments.analysis import regime
    per_trial = trial_results([1.3, 1.6, 1.7, 1.8], computes=[0.5, 0.77, 0.82, 0.85],
                               comm_s=0.5)
    judged = regime.judge(per_trial, 1.0)
    assert [bool(t.ratios) for t in judged] == [True, False, False, False]
    assert "M/C 0.53 is more than 15% off" in judged[3].invalid[registry.OUT_OF_REGIME]
    assert planning.with_planner(judged[3]) is judged[3]  # not checked against the calls
    result = dataclasses.replace(trials.combine(judged), regime=Regime(
        comm_to_compute_asked=1.0, bandwidth_source="calibrated", bandwidth_mbit=19.1,
        achieved_comm_to_compute=trials.spread([trials.comm_to_compute(t) for t in judged])))
    # The calls: trial 0's 1.3 alone, not the median over all four (1.65).
    assert result.ratio_spread["crossover_over_sequential"].values == pytest.approx([1.3])
    assert result.ratios["crossover_over_sequential"] == pytest.approx(1.3)
    assert [e.trial for e in result.invalid[registry.OUT_OF_REGIME]] == [1, 2, 3]
    marks = [r.in_regime for r in regime.trial_regimes(result)]
    assert marks == [True, False, False, False]
    assert regime.in_regime_count(result) == (1, 4)
    table = report.markdown(result)
    assert ("| trial | Mbit/s | A step / C / M (ms) | B step / C / M (ms) | M/C | "
            "within ±15% of 1 |") in table
    assert "| 0 | — | 1050 / 550 / 500 | 1050 / 550 / 500 | 0.91 | yes |" in table
    assert "| 3 | — | 1435 / 935 / 500 | 1435 / 935 / 500 | 0.53 | **no** |" in table
    assert ("1 of 4 trials ran within ±15% of the asked-for M/C 1; the calls rest on the trials "
            "in the regime alone (the other 3 are listed") in table
    assert "Trials in the regime: 1 of 4 within ±15% of the asked-for M/C; the calls rest" in table
    assert report.REGIME_HEADING in table and "- out of the regime (trial 3): its solo" in table
    # No trial in the regime: every trial stays, and the report says the calls hold at the
    # achieved M/C.
    assert regime.judge(per_trial[1:], 1.0) == per_trial[1:]
    untouched = dataclasses.replace(result, invalid={})  # a record from before judge
    assert regime.calls_basis(untouched).startswith("; the calls rest on every trial")
    # A fixed link asks for no M/C: the table shows the drift, nothing is marked or counted.
    fixed = dataclasses.replace(result, regime=dataclasses.replace(
        result.regime, comm_to_compute_asked=None, bandwidth_source="fixed"))
    assert "| M/C | no M/C asked |" in report.markdown(fixed)
    assert regime.in_regime_count(fixed) is None


def test_a_drifting_trial_reshapes_the_link_for_the_next(fake_runs, monkeypatch, tmp_path):
    """Issue 39, item 1: the machine slows after calibration, the trials' compute 1.5x (M/C 2
    falls to 1.33 in trial 0), so trial 1 runs on a link re-shaped from trial 0's C and M and
    is back at M/C 2; the calls rest on trial 1; the drift probe runs before and after the
    trials, and compare.md shows both probes and each trial's link. The crossed scenarios of
    the slowed trials take 0.1 s more a step: the fake's 1.6x crossover was above trial 1's
    ideal (1.100), and a trial whose check fails now leaves the ratios it puts in doubt."""
    fake = scenarios.run_scenario
    slow = 1.5

    def drifting(cluster, c, name, out, run_name="", jobs=("A", "B"), steps=None):
        stats = fake(cluster, c, name, out, run_name, jobs, steps)
        if not run_name.startswith("t"):
            return stats
        extra = 0.1 if name in registry.CROSSED else 0.0
        return {j: job_stats(j, s.step_time_s + (slow - 1) * s.compute_s + extra,
                             slow * s.compute_s, s.comm_s) for j, s in stats.items()}

    monkeypatch.setattr(scenarios, "run_scenario", drifting)
    compare.run(overrides={"comm_to_compute": 2.0, "trials": 2, "out_dir": str(tmp_path)})
    saved = json.loads((tmp_path / "compare.json").read_text())
    links = [t["settings"]["bandwidth_mbit"] for t in saved["per_trial"]]
    first = 5.0 / (2.0 * 0.1 - 0.02)
    # Trial 0: C = 150 ms (device time with the apply), M = 200 ms at 27.8 Mbit/s; k through
    # that M is (0.2 - 0.02) * 27.8 = 5.0, and M/C = 2 needs 5 / (2 * 0.15 - 0.02).
    assert links == pytest.approx([first, 5.0 / (2 * 0.15 - 0.02)])
    assert DRIFT_RUNS == ["start", "end"]
    assert saved["regime"]["drift_probe"]["bandwidth_mbit"] == pytest.approx(first)
    assert saved["regime"]["drift_probe"]["start"]["processes"] > 0
    markdown = (tmp_path / "compare.md").read_text()
    assert "Drift probe (job A alone, 30 steps at 27.78 Mbit/s" in markdown
    assert f"| 1 | {links[1]:.4g} |" in markdown
    assert "- out of the regime (trial 0): its solo runs' M/C 1.33" in markdown
    assert "| 1 | 17.86 | 445 / 150 / 300 | 445 / 150 / 300 | 2.00 | yes |" in markdown
    assert saved["ratio_spread"]["crossover_over_sequential"]["values"] == [
        saved["per_trial"][1]["ratios"]["crossover_over_sequential"]]
    assert saved["per_trial"][0]["ratios"] == {}


def test_the_length_estimate_and_the_budget_fit_the_steps():
    """Issue 34, item 2: a run costs its start-up plus its steps, from the calibration's walls;
    a budget shortens every run's steps to fit, never below warm-up + MIN_TIMED_STEPS."""
    from experiments.comparison import budget
    record = {"points": [
        {"bandwidth_mbit": 100.0, "compute_s": 0.5, "comm_s": 0.1, "wall_s": 48.0, "steps": 30,
         "step_s": 0.6},
        {"bandwidth_mbit": 10.0, "compute_s": 0.5, "comm_s": 0.5, "wall_s": 60.0, "steps": 30,
         "step_s": 1.0}],
        "fit": {"fixed_s": 0.0556, "per_mbit_s": 4.44}, "compute_s": 0.5}
    cost = budget.run_cost(record, 4.44)  # M = 0.0556 + 1 s
    assert cost.start_up_s == pytest.approx(30.0)
    assert cost.step_s == pytest.approx(1.5556)
    names = ["sequential", "naive", "crossover", "crossover_turn"]
    # Per trial: sequential 2 x (30 + 40 x 1.5556) = 184.4 s, each concurrent scenario that
    # over 1.5: 4 trials x (184.4 + 3 x 122.96) = 2213 s.
    assert budget.trials_s(cost, names, 2, 40, 4) == pytest.approx(2213.3, abs=0.5)
    assert budget.fitting_steps(cost, names, 2, 4, 40, 10, 3000.0) == 40
    assert budget.fitting_steps(cost, names, 2, 4, 40, 10, 2000.0) == 34
    assert budget.fitting_steps(cost, names, 2, 4, 40, 10, 600.0) == 30  # the floor
    assert budget.run_cost({"points": [{"bandwidth_mbit": 1, "compute_s": 1, "comm_s": 1}]},
                           1.0) is None  # a record from before the walls


def test_the_drift_probe_is_skipped_on_a_localhost_fallback(fake_runs, monkeypatch, tmp_path):
    """A fixed link without root runs on localhost ranks: no link to probe, so no drift probe
    (and no crash, as the calibration's error would be), and compare.json has none."""
    class Localhost(FakeCluster):
        def __init__(self, bandwidth_mbit):
            super().__init__(bandwidth_mbit)
            self.is_emulated, self.fallback_reason = False, "no root"

    monkeypatch.setattr(calibrate, "cluster", lambda c, bandwidth: Localhost(bandwidth))
    compare.run(overrides={"bandwidth_mbit": 50.0, "out_dir": str(tmp_path),
                           "comm_cpu_probe": False, "budget_minutes": 30.0})
    assert DRIFT_RUNS == []
    assert "drift_probe" not in json.loads((tmp_path / "compare.json").read_text())["regime"]


def test_the_recommendation_rests_on_each_jobs_median_solo_run():
    """The main job of 2026-12-04: the shown trial's solo run of job A was the slowest of four
    (C 692 ms against 540-603), and the recommendation from that trial alone (naive) missed the
    measured winner (cross). Here trial 1 is shown and its solo runs are 3x as slow: its own
    check picks naive, the others cross; the one recommendation comes from each job's median
    solo run, names where they came from, and says cross."""
    regime = Regime(comm_to_compute_asked=1.0, bandwidth_source="calibrated",
                    bandwidth_mbit=10.0, achieved_comm_to_compute=trials.spread([1.0] * 3),
                    link_contention={"shared_efficiency": 0.7, "compute_slowdown": 1.0,
                                     "bandwidth_mbit": 10.0})
    per_trial = [planning.with_planner(summary_lib.summarise(
        scenario_stats(compute_s, 0.15, speedup), 1, {"trial": trial}), regime)
        for trial, (speedup, compute_s) in enumerate(zip([1.2, 1.3, 1.5], [0.1, 0.3, 0.1]))]
    assert [t.planner["recommendation"]["predicted"] for t in per_trial] == \
        ["cross", "naive", "cross"]
    combined = planning.plan_trials(dataclasses.replace(trials.combine(per_trial),
                                                        regime=regime))
    assert combined.representative_trial == 1
    assert combined.planner["recommendation"]["solo_runs"] == {"A": 2, "B": 2}
    assert planning.recommendation(combined) == "cross"
    table = report.markdown(combined)
    assert ("computed once, from each job's median solo run over the trials checked below "
            "(A: trial 2's, B: trial 2's) and the probes") in table
    assert "recommended **cross**" in table
    # One trial checked: the shown trial's own pick stands, as before.
    single = planning.plan_trials(dataclasses.replace(trials.combine(per_trial[1:2]),
                                                      regime=regime))
    assert planning.recommendation(single) == "naive"
    assert "solo_runs" not in single.planner["recommendation"]


def test_a_trial_with_link_turns_but_no_plain_crossover_is_planned_and_judged():
    """The shift experiment runs sequential, naive, shift and crossover_turn, no plain
    crossover: its trials used to get no planner check and its comparison no measured winner,
    so the planner's up-front call could not be scored against it."""
    shift_like = ("sequential", "naive", "crossover_turn")
    per_trial = []
    for trial, speedup in enumerate([1.3, 1.4, 1.5]):
        stats = {n: s for n, s in scenario_stats(0.1, 0.1, speedup).items() if n in shift_like}
        per_trial.append(planning.with_planner(
            bounds.judge(summary_lib.summarise(stats, 1, {"trial": trial}))))
    assert all(t.planner is not None for t in per_trial)
    assert all("crossover_turn/naive" in t.planner["normalised_ratios"] for t in per_trial)
    combined = planning.plan_trials(trials.combine(per_trial))
    chosen = trials.verdict(combined)
    assert chosen["measured_winner"] is not None and chosen["steps"], chosen
    assert sum(chosen["trial_winners"].values()) == 3, chosen
