"""experiments/: flag validation, throughput arithmetic, and an end-to-end comparison run."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import re
import shutil
import sys

import numpy as np
import pytest
from absl import flags

from conftest import REPO_ROOT, run_bounded
from crossover_tf_planner.job_stats import JobStats
from experiments import compare, train
from experiments.analysis import intervals, report, throughput
from experiments.comparison import run as comparison_run
from experiments.comparison import summary as summary_lib
from experiments.comparison import trials as trials_lib


@pytest.fixture(autouse=True)
def _flags():
    compare.define_flags()   # also defines train.py's flags


@pytest.mark.parametrize("overrides, message", [
    ({"model": "resnet1000"}, "unknown model 'resnet1000'; choose one of: mlp"),
    ({"steps": -3}, "steps must be positive, got -3"),
    ({"global_batch_size": 0}, "global_batch_size must be positive"),
    ({"dataset": "imagenet3000"}, "imagenet3000"),
    ({"warmup_steps": 50, "steps": 50}, "warmup_steps must be in"),
    ({"stepz": 3}, "unknown setting(s) ['stepz']"),
    ({"group": "g", "link_turn": 0, "priority": "primary"}, "cannot be combined with link_turn"),
    ({"backend": "auto", "compression": "fp16"}, "Horovod's: give --backend=horovod with them"),
])
def test_train_rejects_bad_settings_clearly(overrides, message):
    with pytest.raises(ValueError) as err:
        train.run(overrides=overrides)
    assert message in str(err.value)


def test_real_dataset_without_data_dir_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="data_dir"):
        train.run(overrides={"dataset": "mnist", "model_dir": str(tmp_path)})
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        train.run(overrides={"dataset": "mnist", "data_dir": str(tmp_path),
                             "model_dir": str(tmp_path)})


def test_compare_rejects_bad_settings_clearly():
    with pytest.raises(ValueError, match="sequential scenario is required"):
        compare.run(overrides={"scenarios": ["crossover"]})
    with pytest.raises(ValueError, match="unknown scenarios"):
        compare.run(overrides={"scenarios": ["sequential", "chaos"]})
    with pytest.raises(ValueError, match="num_hosts must be >= 2"):
        compare.run(overrides={"num_hosts": 1})
    with pytest.raises(ValueError, match="--horovod_timelines needs --backend=horovod"):
        compare.run(overrides={"backend": "tensorflow", "horovod_timelines": True})
    with pytest.raises(ValueError, match="--backend must name horovod or tensorflow"):
        compare.run(overrides={"backend": "auto"})


def _fake_stats(ends_ms: list[float], batch: int = 10, **fields) -> JobStats:
    timing = {"steps": len(ends_ms), "timed_steps": len(ends_ms) - 1, "step_time_s": 0.01,
              "images_per_s": 1000.0, "timed_wall_s": 0.01 * (len(ends_ms) - 1)}
    return JobStats(job="A", global_batch_size=batch,
                    step_end_ns=[int(t * 1e6) for t in ends_ms], **{**timing, **fields})


def test_concurrent_aggregate_counts_only_the_common_window():
    # A steps every 10 ms from 0..200; B every 20 ms from 50..250; warm-up = first step.
    a = _fake_stats(list(np.arange(0, 201, 10.0)))
    b = _fake_stats(list(np.arange(50, 251, 20.0)))
    aggregate, per_job, window = throughput.concurrent_aggregate({"A": a, "B": b}, 1)
    assert window == pytest.approx(0.130)           # from B's first timed step (70) to A's end
    assert per_job["A"] == pytest.approx(13 * 10 / 0.130)    # A steps 80..200
    # B steps 90..190 whole, and half of its step 190..210 (was 6 whole steps: a step cut by
    # the window's edge now counts by its fraction inside it).
    assert per_job["B"] == pytest.approx(6.5 * 10 / 0.130)
    assert aggregate == pytest.approx(per_job["A"] + per_job["B"])
    with pytest.raises(ValueError, match="did not run concurrently"):
        throughput.concurrent_aggregate({"A": _fake_stats([0, 1, 2]),
                                         "B": _fake_stats([5, 6, 7])}, 1)


def test_fractional_steps_count_the_cut_steps_by_their_share_in_the_window():
    """Steps ending at 0, 10, 30, 60 ms: a window 5..45 ms holds half of the first step,
    the second whole, and half of the third; whole steps would say 2 (the guard's count)."""
    ends = np.array([0, 10, 30, 60]) * 1_000_000
    assert throughput.fractional_steps(ends, 5_000_000, 45_000_000) == pytest.approx(2.0)
    assert throughput.fractional_steps(ends, 5_000_000, 30_000_000) == pytest.approx(1.5)
    assert throughput.fractional_steps(ends, 10_000_000, 60_000_000) == pytest.approx(2.0)


def test_step_durations_are_those_the_rates_are_measured_on():
    a = _fake_stats(list(np.arange(0, 201, 10.0)))
    b = _fake_stats(list(np.arange(50, 251, 20.0)))
    durations = throughput.window_step_durations({"A": a, "B": b}, 1)
    assert durations["A"] == pytest.approx([0.01] * 13)     # A's steps ending 80..200
    assert durations["B"] == pytest.approx([0.02] * 6)      # B's ending 90..190
    assert throughput.timed_step_durations(b, 1) == pytest.approx([0.02] * 10)


def test_window_guard_refuses_the_window_that_once_printed_1_39():
    """The CI failure of 1ef155a, by hand: three jobs stepping every 21 ms whose timed phases
    overlapped for 5.3 ms, in which only A completed a step. Refused, saying why and what to
    change; a window of whole timed runs passes."""
    a = _fake_stats([0, 21, 42, 63, 84.0, 105, 126, 147, 168, 189, 194.0])
    b = _fake_stats([167.7 + 21 * i for i in range(11)])
    c = _fake_stats([167.7 + 21 * i for i in range(11)])
    with pytest.raises(throughput.WindowTooShort) as err:
        throughput.concurrent_aggregate({"A": a, "B": b, "C": c}, 1)
    message = str(err.value)
    assert "window was 5.3 ms" in message
    assert "job B completed 0 step(s) in it (need >= 5)" in message
    assert "job C completed 0 step(s)" in message and "--steps" in message
    assert "start barrier" in message
    aligned = _fake_stats([21 * i for i in range(11)])
    aggregate, per_job, window = throughput.concurrent_aggregate(
        {"A": aligned, "B": aligned, "C": aligned}, 1)
    assert window == pytest.approx(0.189) and per_job["B"] == pytest.approx(9 * 10 / 0.189)


def test_window_guard_asks_for_a_share_of_every_timed_run_unless_exempt():
    """Enough steps but a sliver of a long job's run: refused for its share; a secondary
    (exempt: it runs on alone by design) still needs its steps."""
    short = _fake_stats([10 * i for i in range(12)])     # timed run 10..110 ms
    long = _fake_stats([10 * i for i in range(60)])      # timed run 10..590 ms
    with pytest.raises(throughput.WindowTooShort, match=r"covers 17% of job B's timed run"):
        throughput.concurrent_aggregate({"A": short, "B": long}, 1)
    _, per_job, _ = throughput.concurrent_aggregate({"A": short, "B": long}, 1,
                                                     share_exempt=["B"])
    assert per_job["B"] == pytest.approx(per_job["A"])
    with pytest.raises(throughput.WindowTooShort, match="need >= 20"):
        throughput.concurrent_aggregate({"A": short, "B": long}, 1, share_exempt=["B"],
                                        guard=throughput.WindowGuard(min_steps=20))
    assert throughput.concurrent_aggregate({"A": short, "B": long}, 1, guard=None)[2] > 0


def _two_job_stats(crossover_a: JobStats, crossover_b: JobStats) -> dict:
    steady = _fake_stats([10 * i for i in range(21)], compute_s=0.004, comm_s=0.005,
                         apply_s=0.001, timed_wall_s=0.2)
    return {"sequential": {"A": steady, "B": steady}, "naive": {"A": steady, "B": steady},
            "crossover": {"A": crossover_a, "B": crossover_b}}


def test_an_invalid_scenario_stays_out_of_ratios_verdict_and_plot_and_says_why(tmp_path):
    steady = _fake_stats([10 * i for i in range(21)])
    late = _fake_stats([187 + 10 * i for i in range(21)])
    bad = summary_lib.summarise(_two_job_stats(steady, late), 1, {"trial": 0})
    assert "crossover" not in bad.scenarios
    assert not any(k.startswith("crossover") or k == "measured_over_ideal"
                   for k in bad.ratios)
    assert "window was 3.0 ms" in bad.invalid["crossover"]
    good = summary_lib.summarise(_two_job_stats(steady, steady), 1, {"trial": 1})
    assert good.invalid == {} and "crossover_over_naive" in good.ratios
    combined = trials_lib.combine([bad, good])
    assert combined.representative_trial == 1    # the trial that measured crossover
    spread = combined.ratio_spread["crossover_over_naive"]
    assert spread.values == [good.ratios["crossover_over_naive"]]
    assert spread.of_trials == 2
    assert combined.invalid["crossover"][0].trial == 0
    table = report.markdown(combined)
    assert "**Invalid scenarios**" in table and "crossover (trial 0): the jobs'" in table
    assert "(1 of 2 trials)" in table
    assert trials_lib.verdict(combined)["measured_winner"] is not None
    everything_bad = trials_lib.combine([bad])
    assert trials_lib.verdict(everything_bad)["measured_winner"] is None
    with pytest.raises(RuntimeError, match="no concurrent scenario ran long enough"):
        comparison_run.raise_if_nothing_measured(everything_bad, ["sequential", "crossover"])
    report.plot(combined, {}, str(tmp_path / "p.png"))  # per-trial dots skip the invalid


def _noisy(period_ms: float, noise: float, seed: int, steps: int = 41) -> JobStats:
    """A job whose steps last period_ms times (1 + noise x a standard normal)."""
    durations = period_ms * (1 + noise * np.random.default_rng(seed).standard_normal(steps - 1))
    return _fake_stats([0.0, *np.cumsum(durations)], compute_s=0.004, comm_s=0.005,
                       apply_s=0.001, timed_wall_s=float(np.sum(durations[1:])) / 1e3)


def _noisy_trials(crossover_speedup: float, noise: float, trials: int = 3) -> list[dict]:
    """Per-trial summaries: sequential at 10 ms steps, naive each job at 2 x 10 / 1.2 ms, and
    crossover at 2 x 10 / crossover_speedup ms; every job's steps with its own noise."""
    summaries = []
    for t in range(trials):
        def pair(period_ms: float, salt: int) -> dict[str, JobStats]:
            return {j: _noisy(period_ms, noise, seed=100 * t + 10 * salt + k)
                    for k, j in enumerate("AB")}
        stats = {"sequential": pair(10.0, 0), "naive": pair(20 / 1.2, 1),
                 "crossover": pair(20 / crossover_speedup, 2)}
        summaries.append(summary_lib.summarise(stats, 1, {"trial": t}))
    return summaries


def test_bootstrap_interval_is_seeded_and_widens_with_step_noise():
    """The same trials give the same interval; step noise widens it around the median;
    steps of one length leave only the trials' own spread (resampled)."""
    noisy = _noisy_trials(1.3, noise=0.05)
    first = intervals.ratio_interval(noisy, "crossover_over_naive")
    assert first == intervals.ratio_interval(noisy, "crossover_over_naive")
    median = trials_lib.combine(noisy).ratios["crossover_over_naive"]
    assert first.low < median < first.high and first.trials == 3
    quiet = intervals.ratio_interval(_noisy_trials(1.3, noise=0.0), "crossover_over_naive")
    assert quiet.low == pytest.approx(1.3 / 1.2) == pytest.approx(quiet.high)
    assert first.high - first.low > 0.005
    one = intervals.ratio_interval(noisy[:1], "crossover_over_naive")  # only the steps vary
    assert one.low < noisy[0].ratios["crossover_over_naive"] < one.high
    assert intervals.ratio_interval(noisy, "measured_over_ideal") is None


def test_bootstrap_calls_a_clear_gain_a_win_and_no_gain_a_tie():
    """8% faster with 5% step noise is a win; the same speed is a tie, whichever of the two
    happened to be faster in the trials; the combined record keeps every scenario ratio, and
    crossover's measured / ideal."""
    gain = trials_lib.combine(_noisy_trials(1.3, noise=0.05))
    found = gain.ratio_interval
    assert set(found) == {"crossover_over_sequential", "crossover_over_naive",
                          "naive_over_sequential", "measured_over_ideal"}
    assert intervals.call(found["crossover_over_naive"].low,
                          found["crossover_over_naive"].high) == "win"
    assert trials_lib.verdict(gain)["measured_winner"] == "cross"
    same = trials_lib.combine(_noisy_trials(1.2, noise=0.05))
    interval = same.ratio_interval["crossover_over_naive"]
    assert interval.low < 1.0 < interval.high
    assert trials_lib.verdict(same)["measured_winner"] == "naive"
    assert "| crossover / naive |" in report.markdown(same) and "(tie) |" in report.markdown(same)


def test_resampled_means_keep_blocks_of_consecutive_steps():
    rng = np.random.default_rng(0)
    assert intervals.block_length(27) == 3 and intervals.block_length(1) == 1
    assert np.allclose(intervals.resampled_means([0.02] * 10, 50, rng), 0.02)
    means = intervals.resampled_means(np.arange(30.0), 500, rng)
    assert means.shape == (500,) and 10 < means.mean() < 19


def test_scenario_table_shows_one_kind_of_number_and_labels_the_whole_run_rates():
    """The issue's naive trial 0: per-job 140.4 + 139.0 against an aggregate of 283.2, the
    per-job columns whole-run rates and the aggregate the window's. Now the per-job columns
    are the window's (adding up to the aggregate), the whole-run rates in their own table."""
    a = _fake_stats(list(np.arange(0, 201, 10.0)))
    b = _fake_stats(list(np.arange(50, 251, 20.0)))
    steady = _fake_stats([10 * i for i in range(21)], compute_s=0.004, comm_s=0.005,
                         apply_s=0.001, timed_wall_s=0.2)
    summary = summary_lib.summarise({"sequential": {"A": steady, "B": steady},
                                 "naive": {"A": a, "B": b}}, 1, {})
    table = report.markdown(summary)
    assert "| naive | 1000.0 | 500.0 | 1500.0 |" in table     # A 13, B 6.5 steps in 130 ms
    assert report.WINDOWED_NOTE in table and report.WHOLE_RUN_NOTE in table
    assert "| scenario (whole run) | job A images/s | job B images/s |" in table
    assert "| naive | 1000.0 | 1000.0 |" in table              # each job's own images_per_s


def test_a_ratio_above_its_ideal_in_every_trial_is_flagged():
    """Above the ideal in every trial (beyond the spread) is flagged, in the combined record
    too; one trial of several below 1 is the spread, not flagged."""
    flagged = trials_lib.above_ideal({"measured_over_ideal": trials_lib.spread([1.246])})
    assert flagged and "crossover / sequential is above its ideal" in flagged[0]
    assert "1.246" in flagged[0]
    assert trials_lib.above_ideal({"measured_over_ideal": trials_lib.spread([1.05, 1.2])})
    assert not trials_lib.above_ideal({"measured_over_ideal": trials_lib.spread([0.98, 1.2])})
    assert not trials_lib.above_ideal({"measured_over_ideal": trials_lib.spread([0.9])})
    turn = trials_lib.above_ideal({"crossover_turn_measured_over_ideal":
                                   trials_lib.spread([1.01])})
    assert turn and turn[0].startswith("crossover_turn / sequential")
    # From the trials' summaries: crossover at 3x sequential against an ideal of 2.
    fast = _fake_stats([5 * i for i in range(41)])
    summary = summary_lib.summarise(_two_job_stats(fast, fast), 1, {})
    assert summary.ratios["measured_over_ideal"] > 1
    combined = trials_lib.combine([summary])
    assert combined.checks and "**Check failed:**" in report.markdown(combined)


def test_timed_start_barrier_waits_after_warm_up_out_of_the_link_turn(tmp_path):
    """The barrier waits once, after the warm-up steps, with the link turn left for the wait
    and joined again after it; a peer that never comes is a bounded error, and the job then
    stays out of the turns."""
    from experiments import barrier

    class Strategy:  # the two verbs the barrier uses of a CrossoverStrategy
        def __init__(self):
            self.calls = []

        def pause_link_turn(self):
            self.calls.append("pause")

        def resume_link_turn(self):
            self.calls.append("resume")

    spec = barrier.phase(f"{tmp_path}/run:1", "timed")
    assert spec == f"{tmp_path}/run/timed:1"
    strategy = Strategy()
    callback = barrier.TimedStartBarrier(spec, "A-0", after_steps=3, strategy=strategy)
    for step in range(2):
        callback.on_train_batch_end(step)
    assert strategy.calls == [] and not (tmp_path / "run" / "timed").exists()
    callback.on_train_batch_end(2)
    assert strategy.calls == ["pause", "resume"]
    assert (tmp_path / "run" / "timed" / "A-0").exists()
    callback.on_train_batch_end(3)
    assert strategy.calls == ["pause", "resume"]  # once
    lonely, strategy = barrier.phase(f"{tmp_path}/lonely:2", "timed"), Strategy()
    callback = barrier.TimedStartBarrier(lonely, "A-0", after_steps=1, strategy=strategy,
                                         timeout_s=0.2)
    with pytest.raises(TimeoutError, match="did a peer job die"):
        callback.on_train_batch_end(0)
    assert strategy.calls == ["pause"]


def _solo(compute_s: float, comm_s: float, apply_s: float = 0.0, other_s: float = 0.0,
          steps: int = 11, **fields) -> JobStats:
    """A solo job of 10-image steps whose every step computes, communicates and applies for
    the given times (its lease timeline says so), with `other_s` of the step outside them."""
    period = compute_s + comm_s + apply_s + other_s
    starts = [i * period for i in range(steps)]
    phases = [[int(1e9 * t) for t in (s, s + compute_s, s + compute_s + comm_s,
                                      s + compute_s + comm_s, s + compute_s + comm_s + apply_s)]
              for s in starts]
    return _fake_stats([s + period for s in starts], compute_s=compute_s, comm_s=comm_s,
                       apply_s=apply_s, phases_ns=phases, step_time_s=period,
                       timed_wall_s=period * (steps - 1), **fields)


def _ideal(*jobs: JobStats, regime=None) -> float:
    """The ideal crossover / sequential of these solo jobs, as a trial's summary gives it."""
    summary = summary_lib.summarise({"sequential": dict(zip("ABC", jobs))}, 1, {}, regime)
    return summary.ratios["ideal_crossover_over_sequential"]


def test_ideal_ratio_matches_hand_computed_cases():
    equal = _solo(0.04, 0.05, apply_s=0.01)  # device time D = compute + apply = 0.05
    assert _ideal(equal, equal) == pytest.approx(2.0)
    no_comm = _solo(0.05, 0.0)
    assert _ideal(no_comm, no_comm) == pytest.approx(1.0)
    a, b = _solo(0.03, 0.05), _solo(0.05, 0.02)
    # round = max(D_A + D_B = .08, M_A + M_B = .07, own steps .08, .07) = .08 for .15 solo
    assert _ideal(a, b) == pytest.approx(0.15 / 0.08)
    # Three equal jobs at M = 2C share the links: a round is 3M, so (C+M)/M = 1.5, as for two.
    m2 = _solo(0.05, 0.10)
    assert _ideal(m2, m2, m2) == pytest.approx(0.45 / 0.30)
    assert _ideal(m2, m2) == pytest.approx(1.5)
    # Three jobs, one with a short allreduce: the links (sum M = .21) still set the round.
    short = _solo(0.05, 0.01)
    assert _ideal(m2, m2, short) == pytest.approx(0.36 / 0.21)
    # Time outside the phases (input, Python) is part of each solo step: 2 x .12 in .10.
    assert _ideal(*[_solo(0.04, 0.05, apply_s=0.01, other_s=0.02)] * 2) == pytest.approx(
        0.24 / 0.12)
    with pytest.raises(ValueError, match=">= 2 jobs"):
        _ideal(m2)


def test_ideal_uses_mean_times_not_medians():
    """Steps of 40 ms device and 50 ms allreduce, one in five with a 90 ms allreduce: the
    medians (and the record's comm_s) say 50 ms, the means 58 ms, and the mean step is what
    the measured rates divide by; the ideal round is the link's 2 x 58 ms."""
    from crossover_tf_planner.compare_record import Trial
    from experiments.analysis import ideal
    slow = _solo(0.04, 0.05)
    phases = np.asarray(slow.phases_ns)
    shift = np.zeros_like(phases)
    for step in range(0, len(phases), 5):  # steps 0, 5, 10 allreduce 40 ms longer
        shift[step:, 2:] += 40_000_000
        shift[step + 1:, :2] += 40_000_000
    slow = dataclasses.replace(slow, phases_ns=(phases + shift).tolist(),
                               step_end_ns=(phases + shift)[:, 4].tolist())
    assert ideal.mean_phases_s(slow, 1) == pytest.approx((0.04, 0.05 + 0.04 * 2 / 10))
    trial = Trial({"solo_A": summary_lib.ScenarioResult({"A": slow}, 1.0),
                   "solo_B": summary_lib.ScenarioResult({"B": slow}, 1.0)})
    assert ideal.ideal_round(trial, 1).link_s == pytest.approx(2 * 0.058)
    assert ideal.mean_phases_s(_fake_stats([0, 1], compute_s=0.03, comm_s=0.02,
                                           apply_s=0.01), 1) == (0.04, 0.02)  # no timeline


def test_the_cores_cpu_estimate_is_shown_but_bounds_nothing():
    """M = C: device and link both .1 s a round; an allreduce costing 20 ms of the core's CPU
    makes a .14 s core estimate, shown beside the bound and not in it (crossed jobs ran faster
    than such a round: ideal.py)."""
    from crossover_tf_planner.compare_record import Regime
    equal = _solo(0.05, 0.05)
    probe = Regime(comm_cpu={"cpu_per_wait_s": 0.4, "cpu_s_per_mb": 0.0},
                   bandwidth_mbit=100.0)
    assert _ideal(equal, equal) == pytest.approx(2.0)
    assert _ideal(equal, equal, regime=probe) == pytest.approx(2.0)
    summary = summary_lib.summarise({"sequential": {"A": equal, "B": equal}}, 1, {}, probe)
    assert summary.ideal.bound_by != "core CPU" and summary.ideal.core_s == pytest.approx(0.14)
    note = report.ideal_note(summary.ideal)
    assert note.startswith(report.IDEAL_NOTE)
    assert "device 100.0, link 100.0, own step 100.0 ms per round. The core's CPU estimate" \
        in note and "140.0 ms, is not a bound" in note


def test_a_measured_ratio_above_its_ideal_is_flagged_only_beyond_its_interval():
    """Hand-made records: measured / ideal 1.08 whose interval 1.03–1.12 lies wholly above 1
    is flagged; 1.08 whose interval 0.97–1.15 includes 1 is not (the noise reaches the bound);
    the interval decides even where every trial was above 1."""
    from crossover_tf_planner.compare_record import Interval
    above = {"measured_over_ideal": trials_lib.spread([1.05, 1.08, 1.1])}

    def interval(low: float, high: float) -> dict[str, Interval]:
        return {"measured_over_ideal": Interval(low, high, 0.95, 3, 2000, "hand-made")}

    flagged = trials_lib.above_ideal(above, interval(1.03, 1.12))
    assert flagged and "crossover / sequential is above its ideal" in flagged[0]
    assert "interval 1.030–1.120 lies wholly above 1" in flagged[0]
    assert not trials_lib.above_ideal(above, interval(0.97, 1.15))
    assert intervals.describe(interval(0.97, 1.15)["measured_over_ideal"],
                              judge=intervals.ideal_call) == "0.970–1.150 (within the ideal)"
    assert intervals.ideal_call(1.03, 1.12) == "above the ideal"


def test_the_combined_record_flags_measured_over_ideal_by_its_bootstrap_interval():
    """From trials' summaries: crossover at the ideal with 5% step noise has an interval that
    includes 1 (not flagged, read "within the ideal" in compare.md); 10% above it lies wholly
    above (flagged)."""
    at_ideal = trials_lib.combine(_noisy_trials(2.0, noise=0.05))
    found = at_ideal.ratio_interval["measured_over_ideal"]
    assert found.low < 1.0 < found.high and not at_ideal.checks
    assert re.search(r"\| measured / ideal \| [^|]+ \| [0-9.–]+ \(within the ideal\) \|",
                     report.markdown(at_ideal))
    beyond = trials_lib.combine(_noisy_trials(2.2, noise=0.05))
    assert beyond.ratio_interval["measured_over_ideal"].low > 1.0
    assert beyond.checks and "lies wholly above 1" in beyond.checks[0]
    assert "(above the ideal)" in report.markdown(beyond)


def test_sequential_scenario_credits_each_job_its_share_of_the_images():
    a = _fake_stats(list(range(11)), batch=10, timed_wall_s=1.0, compute_s=0.02, comm_s=0.03,
                    apply_s=0.01)
    b = _fake_stats(list(range(11)), batch=30, timed_wall_s=2.0, compute_s=0.02, comm_s=0.03,
                    apply_s=0.01)
    summary = summary_lib.summarise({"sequential": {"A": a, "B": b}}, 1, {})
    sequential = summary.scenarios["sequential"]
    assert sequential.aggregate_images_per_s == pytest.approx((100 + 300) / 3.0)
    assert sequential.per_job_in_aggregate["B"] == pytest.approx(300 / 3.0)
    assert summary.scenarios["solo_A"].jobs["A"] == a
    assert "| A | 30.0 | 30.0 | 10.0 |" in report.markdown(
        dataclasses.replace(summary, ratios={k: 1.0 for k in (
            "crossover_over_sequential", "crossover_over_naive",
            "ideal_crossover_over_sequential", "measured_over_ideal")}))


def test_train_argv_is_validated_and_round_trips_through_train_flags():
    argv = train.train_argv({"job": "B", "group": "g1", "model": "mlp", "steps": 12,
                             "start_barrier": ""})
    assert argv[1:3] == ["-m", "experiments.train"]
    parsed = flags.FlagValues()
    train.define_flags(parsed)
    parsed(["train", *argv[3:]])
    assert (parsed.job, parsed.group, parsed.model, parsed.steps) == ("B", "g1", "mlp", 12)
    assert parsed.data_dir is None  # train.py's default
    from crossover_tf.options import LeaseOptions  # loads TensorFlow: only this check needs it
    assert parsed.lease_timeout_s == LeaseOptions().timeout_s  # one default for one setting
    with pytest.raises(ValueError, match="steps must be positive"):
        train.train_argv({"steps": 0})
    with pytest.raises(ValueError, match="unknown setting"):
        train.train_argv({"lease_timeout": 3})


TINIEST_COMPARISON = {
    # Enough steps (~20 ms each) for the secondary, which compiles on a core the primary
    # already steps on (about 2.5 s here), to overlap the primary's timed steps.
    "model": "mlp", "dataset": "synthetic:mnist", "global_batch_size": 32, "steps": 300,
    "warmup_steps": 10, "bandwidth_mbit": 200.0, "timeout_s": 300.0,
    "scenarios": ["sequential", "naive", "crossover", "crossover_turn", "priority"],
    "secondary_micro_batches": 2, "horovod_timelines": True, "contention_probe_seconds": 3.0}


@pytest.fixture(scope="module")
def tiniest_comparison(tmp_path_factory) -> tuple[pathlib.Path, dict]:
    """compare.py end to end on the tiniest model, run once for the tests that read it."""
    compare.define_flags()
    out_dir = tmp_path_factory.mktemp("compare")
    return out_dir, compare.run(overrides={**TINIEST_COMPARISON, "out_dir": str(out_dir)})


@pytest.mark.multiprocess
@pytest.mark.slow
def test_compare_end_to_end_on_the_tiniest_model(tiniest_comparison):
    tmp_path, result = tiniest_comparison
    for name in ("compare.json", "compare.md", "compare.png", "attribution.md",
                 "attribution_turn.md"):
        assert (tmp_path / name).stat().st_size > 0, name
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert set(saved["scenarios"]) == {"solo_A", "solo_B", "sequential", "naive", "crossover",
                                       "crossover_turn", "priority"}
    # Link turns: every step's allreduce took one, and the two jobs' turns never overlapped.
    turned = saved["scenarios"]["crossover_turn"]["jobs"]
    for job in ("A", "B"):
        assert turned[job]["turn"]["turns"] == 300, turned[job]["turn"]
        assert len(turned[job]["turn_events_ns"]) == 300
    turn_attribution = json.loads((tmp_path / "attribution_turn.json").read_text())
    assert turn_attribution["scenario"] == "crossover_turn"
    overlapped = turn_attribution["allreduce_overlap"]["overlapped_fraction"]
    assert max(overlapped.values()) < 0.01, overlapped
    priority_jobs = saved["scenarios"]["priority"]["jobs"]
    assert (priority_jobs["A"]["priority"], priority_jobs["B"]["priority"]) == (
        "primary", "secondary")
    assert priority_jobs["B"]["micro_batches"] == 2
    # Two compute holds per step for the secondary, one (plus the apply) for the primary.
    tags = [e[3] for e in priority_jobs["B"]["lease_events_ns"]]
    assert tags.count(1) == 2 * tags.count(2)
    # The secondary computed beside the primary, so the primary waited at some point, and each
    # wait lies inside one of its timed steps (asked for after the step before it ended).
    primary_steps_ns = np.diff(JobStats.from_dict(priority_jobs["A"]).step_end_ns[
        TINIEST_COMPARISON["warmup_steps"] - 1:])
    assert 0 < saved["ratios"]["primary_max_wait_s"] <= primary_steps_ns.max() / 1e9
    assert saved["ratios"]["primary_over_solo"] > 0
    attribution = json.loads((tmp_path / "attribution.json").read_text())
    assert attribution["round_ms"] > 0 and attribution["hand-offs_per_round"] > 0
    # Every rank saved its record, so each allreduce splits into waiting for the other host's
    # rank and the rest.
    assert (tmp_path / "tensorboard" / "t0_crossover" / "B" / "stats.rank1.json").exists()
    for job in ("A", "B"):
        for run in ("solo", "crossed"):
            split = attribution["allreduce_split"][job][run]
            assert 0 <= split["wait_for_last_rank_ms"] <= split["total_ms"]
            assert 0 < split["after_last_rank_ms"] <= split["total_ms"]
    for scenario in saved["scenarios"].values():
        assert math.isfinite(scenario["aggregate_images_per_s"])
        assert scenario["aggregate_images_per_s"] > 0
    for value in saved["ratios"].values():
        assert math.isfinite(value) and value > 0
    for job in ("A", "B"):
        solo = JobStats.from_dict(saved["scenarios"][f"solo_{job}"]["jobs"][job])
        assert solo.compute_s > 0 and solo.apply_s > 0 and solo.comm_s > 0
        # Each step's end on both clocks (clock_steps.py): as many, the monotonic increasing.
        assert len(solo.step_end_mono_ns) == len(solo.step_end_ns) == solo.steps
        assert (np.diff(solo.step_end_mono_ns) > 0).all()
        crossed = saved["scenarios"]["crossover"]["jobs"][job]
        assert crossed["images_per_s"] > 0
    assert "crossover / sequential" in (tmp_path / "compare.md").read_text()
    assert "planner" in saved and saved["planner"]["prediction"]
    runs = {p.parent.parent.name + "/" + p.parent.name
            for p in (tmp_path / "tensorboard").glob("*/*/events.out.tfevents.*")}
    assert runs == {f"t0_{s}/{j}" for s in ("sequential", "naive", "crossover", "crossover_turn",
                                            "priority") for j in "AB"}
    assert result.ratios == saved["ratios"]
    assert saved["trials"] == 1 and saved["regime"]["bandwidth_source"] == "fixed"
    assert saved["regime"]["achieved_comm_to_compute"]["median"] > 0


@pytest.mark.multiprocess
@pytest.mark.slow
def test_compare_end_to_end_under_the_tensorflow_backend(tmp_path):
    """compare --backend=tensorflow (issue 33): every scenario's ranks and the comm probes run
    on TensorFlow's collectives, launched with TF_CONFIG on the emulated hosts; the link turns
    still order the two jobs' allreduces."""
    compare.define_flags()
    steps = 150
    compare.run(overrides={
        **TINIEST_COMPARISON, "steps": steps, "scenarios": ["sequential", "crossover_turn"],
        "horovod_timelines": False, "backend": "tensorflow", "out_dir": str(tmp_path),
        "drift_probe": False})
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert saved["settings"]["backend"] == "tensorflow"
    turned = saved["scenarios"]["crossover_turn"]["jobs"]
    for job in ("A", "B"):
        assert turned[job]["size"] == 2 and turned[job]["turn"]["turns"] == steps, turned[job]
    for value in saved["ratios"].values():
        assert math.isfinite(value) and value > 0
    if saved["settings"]["cluster"]["emulated"]:  # the probes ran (root): on the same backend
        assert saved["regime"]["comm_cpu"]["probe"]["allreduces"] > 0
        assert saved["regime"]["link_contention"]["shared_efficiency"] > 0
    header = (tmp_path / "logs" / "t0_crossover_turn" / "A" / "rank0.log").read_text()
    assert "--backend=tensorflow" in header.splitlines()[0], header[:2000]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_compare_end_to_end_measures_the_shaped_links(tiniest_comparison):
    """The same comparison's root-only part: on shaped links the CPU and contention probes
    ran, the drift probe ran before and after the trials (issue 39) and compare.md shows it,
    and Horovod's timelines split each allreduce."""
    tmp_path, _ = tiniest_comparison
    saved = json.loads((tmp_path / "compare.json").read_text())
    cluster = saved["settings"]["cluster"]
    if not cluster["emulated"]:
        pytest.skip(f"needs root and ip netns: the comparison ran on localhost "
                    f"({cluster['fallback_reason']})")
    attribution = json.loads((tmp_path / "attribution.json").read_text())
    # Process CPU seconds per wall second: no more than the cores the ranks can run on.
    assert 0 <= saved["regime"]["comm_cpu"]["cpu_per_wait_s"] <= os.cpu_count()
    assert saved["regime"]["link_contention"]["shared_efficiency"] > 0
    assert saved["planner"]["link_contention"] == saved["regime"]["link_contention"]
    drift = saved["regime"]["drift_probe"]
    for when in ("start", "end"):
        assert drift[when]["step_s"] > 0 and drift[when]["processes"] > 0, drift
    assert "Drift probe (job A alone, 30 steps at 200 Mbit/s" in (
        tmp_path / "compare.md").read_text()
    assert set(attribution["horovod"]["A"]) == {"sequential", "crossover"}
    assert attribution["horovod"]["A"]["crossover"]["transfer_ms"] > 0


@pytest.mark.multiprocess
@pytest.mark.slow
def test_attribute_command_on_the_saved_comparison(tiniest_comparison, tmp_path):
    """docs/experiments.md's `python -m experiments.attribute --dir=...`, run as documented on
    a copy of the tiniest comparison's directory: from the saved run alone it writes the
    attribution the comparison wrote (a command no test runs rots silently, issue 38)."""
    saved, _ = tiniest_comparison
    copy = tmp_path / "compare"
    shutil.copytree(saved, copy, ignore=shutil.ignore_patterns("attribution*"))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = run_bounded([sys.executable, "-m", "experiments.attribute", f"--dir={copy}"],
                         env, timeout=120, cwd=str(REPO_ROOT))
    assert result.returncode == 0, result.stdout[-4000:]
    for suffix in ("json", "md"):
        written = (copy / f"attribution.{suffix}").read_text()
        assert written == (saved / f"attribution.{suffix}").read_text(), suffix


@pytest.mark.multiprocess
@pytest.mark.slow
def test_compare_three_jobs_crossing_end_to_end(tmp_path):
    """compare.py --jobs=3: three jobs share each host's lease in FIFO turns; every job makes
    progress and the report shows them all."""
    # 24 steps (20 timed): at 14, a fresh-clone run's window covered 47% of two jobs' timed runs
    # (the guard needs 50%); a timed run of a few ms steps is mostly its start's skew.
    compare.run(overrides={
        "model": "mlp", "dataset": "synthetic:mnist", "global_batch_size": 32, "steps": 24,
        "warmup_steps": 4, "bandwidth_mbit": 200.0, "out_dir": str(tmp_path), "jobs": 3,
        "timeout_s": 300.0, "scenarios": ["sequential", "crossover"], "comm_cpu_probe": False,
        "drift_probe": False})
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert saved["invalid"] == {}, saved["invalid"]  # the window guard is on and passed
    crossed = saved["scenarios"]["crossover"]
    assert set(crossed["jobs"]) == {"A", "B", "C"}
    # Every job completed at least the guard's steps inside the window (20 timed steps each,
    # started together after warm-up by the timed barrier).
    guard = throughput.WindowGuard()
    steps_in = {job: rate * crossed["window_s"] / 32
                for job, rate in crossed["per_job_in_aggregate"].items()}
    assert all(n >= guard.min_steps for n in steps_in.values()), steps_in
    intervals = sorted((s[1], s[2], job) for job, j in crossed["jobs"].items()
                       for s in j["lease_events_ns"] if s[2])
    for (_, end, a), (start, _, b) in zip(intervals, intervals[1:]):
        assert end <= start, f"jobs {a} and {b} held host 0's device at once"
    assert "job C images/s" in (tmp_path / "compare.md").read_text()
    assert saved["ratios"]["ideal_crossover_over_sequential"] > 1


@pytest.mark.multiprocess
@pytest.mark.slow
def test_compare_shift_end_to_end_on_the_tiniest_model(tmp_path):
    """The shift scenario on the tiniest comparison: job B leaves the timed-start barrier the
    rule's shift after job A (its sleep lands in its last warm-up step), both free-running
    without a lease, and the comparison reports shift / naive with its interval."""
    warmup = TINIEST_COMPARISON["warmup_steps"]
    compare.run(overrides={
        **TINIEST_COMPARISON, "steps": 120, "scenarios": ["sequential", "naive", "shift"],
        "horovod_timelines": False, "comm_cpu_probe": False, "drift_probe": False,
        "out_dir": str(tmp_path)})
    saved = json.loads((tmp_path / "compare.json").read_text())
    plan = saved["per_trial"][0]["settings"]["shift"]
    shifts = plan["start_shifts_s"]
    assert shifts["A"] == 0.0 and 0.0 <= shifts["B"] < plan["hyperperiod_s"]
    jobs = {job: JobStats.from_dict(saved["scenarios"]["shift"]["jobs"][job]) for job in "AB"}
    assert all(not j.group for j in jobs.values())  # free-running, as in naive
    late_s = (jobs["B"].step_end_ns[warmup - 1] - jobs["A"].step_end_ns[warmup - 1]) / 1e9
    assert shifts["B"] - 0.05 < late_s < shifts["B"] + 0.1, (late_s, shifts)
    assert saved["ratios"]["shift_over_naive"] > 0 and saved["ratio_interval"]["shift_over_naive"]
    assert "| shift / naive |" in (tmp_path / "compare.md").read_text()
    header = (tmp_path / "logs" / "t0_shift" / "B" / "rank0.log").read_text().splitlines()[0]
    assert f"--start_shift_s={shifts['B']}" in header, header[:2000]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_real_jobs_of_unequal_length_make_a_window_the_guard_refuses(tmp_path):
    """Two real jobs started together (both barriers) where B runs 8x as many steps as A: the
    window is A's timed run, a sliver of B's, and the guard says so; the same jobs pass with
    B exempt from the share, and every step of A lies inside the window (timed together)."""
    from experiments import launch_pair
    from experiments.comparison import scenarios
    from experiments.cluster.netns import EmulatedCluster
    compare.define_flags()
    c = config_settings({"model": "mlp", "dataset": "synthetic:mnist", "global_batch_size": 32,
                         "steps": 14, "warmup_steps": 4, "timeout_s": 300.0,
                         "force_localhost": True, "bandwidth_mbit": 100.0})
    barrier = f"{tmp_path / 'barriers'}:{2 * c.num_hosts}"
    commands = {job: scenarios.train_command(c, job, "", str(tmp_path / "tb"), barrier,
                                             steps=steps)
                for job, steps in (("A", 14), ("B", 84))}
    with EmulatedCluster(num_hosts=c.num_hosts, force_localhost=True) as cluster:
        results = launch_pair.run_jobs(cluster, commands, mode="concurrent",
                                       log_dir=str(tmp_path / "logs"), timeout_s=300.0)
    launch_pair.raise_on_failure(results, "unequal jobs")
    stats = {job: JobStats.from_json(tmp_path / "tb" / job / "stats.json") for job in "AB"}
    with pytest.raises(throughput.WindowTooShort, match=r"of job B's timed run \(need >= 50%\)"):
        throughput.concurrent_aggregate(stats, 4)
    _, per_job, window = throughput.concurrent_aggregate(stats, 4, share_exempt=["B"])
    ends = {job: np.asarray(stats[job].step_end_ns, dtype=np.int64) for job in "AB"}
    # Timed together: both jobs leave the timed-start barrier at the end of warm-up step 4 at
    # about the same moment (its file polling: ~10 ms), not a compile time apart.
    assert abs(ends["A"][3] - ends["B"][3]) < 100e6
    # The window opens when the later job ends its first timed step and closes with A's last,
    # so A's 10 timed steps count 9 intervals, less the part of one that B's first timed step
    # can end after A's (a CI run lost 1.2 of A's 11 ms steps there: 9 +- 1 was not a bound).
    late_s = max(0, ends["B"][4] - ends["A"][4]) / 1e9
    a_step_s = float(np.median(np.diff(ends["A"][4:]))) / 1e9
    assert per_job["A"] * window / 32 == pytest.approx(9 - late_s / a_step_s, abs=0.5)


def config_settings(overrides: dict) -> object:
    """compare.py's resolved settings for these overrides (its defaults otherwise)."""
    from experiments import config as config_lib
    fresh = flags.FlagValues()
    compare.define_flags(fresh)
    return config_lib.resolve(fresh, compare.FLAG_NAMES, overrides, compare.validate, "compare")


def test_scripts_sharing_flags_agree_on_their_types():
    """Every script's flags on one FlagValues (as compare.py loads train.py's): a shared name
    must keep one type, or `--flag` of a boolean could swallow the next argument."""
    from absl import flags as absl_flags

    from experiments import attribute, config, launch_pair, plan, replan, train
    flag_values = absl_flags.FlagValues()
    for script in (compare, train, launch_pair, plan, attribute, replan):
        script.define_flags(flag_values)
    flag_values(["prog", "--horovod_timelines", "--out_dir=elsewhere", "--jobs=3"])
    assert flag_values.horovod_timelines is True and flag_values.out_dir == "elsewhere"
    assert flag_values.horovod_timeline == ""  # train.py's own (a file name), untouched
    define = config.flag_definer(flag_values)
    with pytest.raises(ValueError, match="defined as string and again as bool"):
        define(absl_flags.DEFINE_boolean, "out_dir", False, "a clash")
