"""Link contention: the probe's arithmetic, and what the planner does with it (why naive
co-location and plain crossing fall short where the link is the bottleneck, and link turns
do not)."""
from __future__ import annotations

import dataclasses

import pytest

from crossover_tf_planner import analytical
from crossover_tf_planner.comm_cost import LinkContention, busy_s, fit_contention
from crossover_tf_planner.profile import JobProfile
from crossover_tf_planner.compare_record import Comparison
from experiments.analysis import sweep
from experiments.comparison import trials
from experiments.probes import comm_cpu


def pair(compute_s: float, comm_s: float) -> tuple[JobProfile, JobProfile]:
    a = JobProfile(name="A", compute_s=compute_s, comm_s=comm_s)
    return a, dataclasses.replace(a, name="B")


def test_busy_time_is_the_union_of_the_spans():
    assert busy_s([]) == 0.0
    assert busy_s([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0), (3.5, 3.6)]) == pytest.approx(3.0)


def test_contention_counts_the_allreduces_inside_the_window_both_jobs_ran():
    """Solo: 1 s per allreduce. Both jobs ran from b's first start (1 s) to a's last end
    (10.5 s); inside, three 1.5 s allreduces each, b's overlapping a's by 0.5 s twice, so the
    link was busy 1.5 + 2.5 + 2.5 + 1.5 = 8 s for six solo seconds' worth (0.75). a's first
    allreduce began before b ran and b's last one ended after a stopped: neither counts."""
    shared = {"a": [(0.0, 1.5), (3.0, 4.5), (6.0, 7.5), (9.0, 10.5)],
              "b": [(1.0, 2.5), (4.0, 5.5), (7.0, 8.5), (12.0, 13.5)]}
    fitted = fit_contention(1.0, 1.1, shared)
    assert fitted.probe["allreduces"] == {"a": 3, "b": 3}
    assert fitted.shared_efficiency == pytest.approx(6 / 8)
    assert fitted.compute_slowdown == pytest.approx(1.1)
    assert fitted.probe["window_s"] == pytest.approx(9.5)
    with pytest.raises(RuntimeError, match="too few allreduces while both jobs ran"):
        fit_contention(1.0, 1.1, {"a": shared["a"][:2], "b": shared["b"]})
    with pytest.raises(ValueError, match="implausible link contention"):
        LinkContention(shared_efficiency=0.0)
    assert LinkContention.from_dict(None) == LinkContention()
    assert LinkContention.from_dict(fitted.to_dict()) == fitted


def test_probe_gaps_agree_within_a_job_and_differ_between_jobs(monkeypatch):
    monkeypatch.setenv("CROSSOVER_JOB", "gapped_a")
    first, again = comm_cpu._gaps(0.5, 20.0, 0.5), comm_cpu._gaps(0.5, 20.0, 0.5)
    assert first == again and len(first) == 20  # 20 s of 0.5 s allreduces and 0.5 s gaps
    assert all(0.0 <= g <= 1.0 for g in first) and max(first) - min(first) > 0.3
    monkeypatch.setenv("CROSSOVER_JOB", "gapped_b")
    assert comm_cpu._gaps(0.5, 20.0, 0.5) != first
    assert comm_cpu._gaps(0.0, 20.0, 0.5) == [0.0] * 40  # back to back
    assert len(comm_cpu._gaps(0.0, 1e6, 1e-3)) == comm_cpu.MAX_ALLREDUCES


def _cpu(a: JobProfile, b: JobProfile, **contention: float) -> analytical.PairPrediction:
    return analytical.predict_pair(a, b, model="cpu", samples=0,
                                   contention=LinkContention(**contention))


def test_a_link_that_loses_under_random_overlap_caps_naive_and_crossing_but_not_turns():
    """M/C 1.5 (C 0.4 s, M 0.6 s, solo step 1 s): the link bounds a round. Overlapping at
    random it moves 0.8 of itself, so naive and plain crossing need 1.2 / 0.8 = 1.5 s per
    round; with link turns the allreduces go one at a time: 1.2 s."""
    p = _cpu(*pair(0.4, 0.6), shared_efficiency=0.8)
    assert p.normalised["naive"] == pytest.approx(2 / 1.5)
    assert p.normalised["crossover"] == pytest.approx(2 / 1.5)
    assert p.normalised["crossover_turn"] == pytest.approx(2 / 1.2)
    assert (p.recommendation, p.best_policy) == ("cross", "crossover_turn")
    assert "crossover_turn" in p.reason
    # A link that shares without loss leaves nothing to win over naive co-location.
    ideal = _cpu(*pair(0.4, 0.6))
    assert ideal.normalised["naive"] == pytest.approx(ideal.normalised["crossover_turn"])
    assert ideal.recommendation == "naive"
    # Where the core bounds the round (M/C 0.5), the link's loss costs nothing either.
    cpu_bound = _cpu(*pair(0.6, 0.3), shared_efficiency=0.8)
    assert cpu_bound.normalised["naive"] == pytest.approx(2 * 0.9 / 1.2)
    assert cpu_bound.normalised["crossover_turn"] == pytest.approx(2 * 0.9 / 1.2)
    assert cpu_bound.recommendation == "naive"


def test_allreduces_slow_down_for_the_share_of_the_round_the_core_computes():
    """Allreduces 1.2x as long beside a busy core, which computes 0.8 s of a round R: with
    turns R = 1.2 * (1 + 0.2 * 0.8 / R), i.e. R^2 - 1.2 R - 0.192 = 0."""
    p = _cpu(*pair(0.4, 0.6), compute_slowdown=1.2)
    round_s = (1.2 + (1.44 + 4 * 0.192) ** 0.5) / 2
    assert p.normalised["crossover_turn"] == pytest.approx(2 / round_s, rel=1e-6)
    # A GPU's compute is not on the allreduce's core: no slowdown there.
    gpu = analytical.predict_pair(*pair(0.4, 0.6), model="gpu", samples=0,
                                  contention=LinkContention(compute_slowdown=1.2))
    assert gpu.normalised["crossover_turn"] == pytest.approx(2 / 1.2)


def test_the_gpu_model_shares_the_link_at_its_measured_efficiency():
    a, b = pair(0.4, 0.6)
    lossless = analytical.predict_pair(a, b, model="gpu", samples=0)
    lossy = analytical.predict_pair(a, b, model="gpu", samples=0,
                                    contention=LinkContention(shared_efficiency=0.7))
    assert lossy.normalised["naive"] < lossless.normalised["naive"] - 0.05
    assert lossy.normalised["crossover_turn"] == pytest.approx(
        lossless.normalised["crossover_turn"])


def test_a_tie_between_the_crossings_goes_to_plain_crossover():
    tie = {"naive": 1.5, "crossover": 1.8, "crossover_turn": 1.8}
    assert analytical.recommended(tie)[:2] == ("cross", "crossover")
    assert analytical.recommended({**tie, "crossover_turn": 1.9})[:2] == (
        "cross", "crossover_turn")
    # Neither crossing gains the 5% over naive co-location.
    assert analytical.recommended({**tie, "crossover_turn": 1.56, "crossover": 1.52})[:2] == (
        "naive", "naive")


def _trial(naive: float, crossover: float, turn: float | None) -> dict:
    ratios = {"naive_over_sequential": naive, "crossover_over_sequential": crossover,
              "crossover_over_naive": crossover / naive}
    if turn is not None:
        ratios |= {"crossover_turn_over_sequential": turn,
                   "crossover_turn_over_naive": turn / naive}
    return {"ratios": ratios, "planner": {"recommendation": {"predicted": "cross"}}}


def test_the_measured_winner_counts_crossing_with_link_turns():
    per_trial = [_trial(1.5, 1.5, 1.7), _trial(1.5, 1.55, 1.6), _trial(1.5, 1.45, 1.55)]
    result = {"ratios": {k: sorted(t["ratios"][k] for t in per_trial)[1]
                         for k in per_trial[0]["ratios"]}, "per_trial": per_trial}
    verdict = trials.verdict(Comparison.from_dict({"scenarios": {}, **result}))
    # Crossing with link turns was the faster policy in every trial (1.7, 1.6, 1.55 against
    # naive's 1.5): it counts as crossing, in the verdict and in each trial's count.
    assert (verdict["predicted"], verdict["measured_winner"]) == ("cross", "cross")
    assert verdict["trial_winners"] == {"cross": 3}
    plain = [_trial(1.5, 1.5, None), _trial(1.5, 1.55, None)]
    result = {"ratios": plain[0]["ratios"], "per_trial": plain}
    assert trials.verdict(Comparison.from_dict({"scenarios": {}, **result}))["measured_winner"] \
        == "naive"


def test_the_sweep_table_shows_crossing_with_turns_where_it_ran():
    def spread(value: float) -> dict:
        return trials.spread([value])

    base = {"comm_to_compute_asked": 1.0, "achieved_comm_to_compute": spread(1.3),
            "bandwidth_mbit": 12.69, "trials": 1,
            "crossover_over_naive": {"measured": spread(1.05), "analytical": 1.0,
                                     "simulated": 1.2},
            "crossover_over_sequential": {"measured": spread(1.5), "analytical": 1.5,
                                          "simulated": 1.7},
            "recommendation": {"predicted": "cross", "measured_winner": "cross"}}
    turned = {**base, "crossover_turn_over_naive": {"measured": spread(1.16),
                                                    "analytical": 1.18, "simulated": None}}
    table = sweep.markdown([turned, {**base, "comm_to_compute_asked": 2.0}])
    assert "| crossover_turn/naive measured | predicted (cpu model / gpu-like sim) |" in table
    assert "| 1.160 | 1.180 / — | cross | cross |" in table
    assert "| 1.500 | 1.500 / 1.700 | — | — | cross | cross |" in table
    assert "crossover_turn/naive" not in sweep.markdown([base])  # no column where it never ran
