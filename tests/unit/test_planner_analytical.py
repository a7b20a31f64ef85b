"""Analytical pair model against hand-computed cases."""

import dataclasses

import numpy as np
import pytest

from crossover_tf_planner import analytical, fluid
from crossover_tf_planner.policies import PREDICTED
from crossover_tf_planner.profile import JobProfile


def job(name, compute, comm, **kw):
    return JobProfile(name=name, compute_s=compute, comm_s=comm, **kw)


def test_equal_compute_and_comm_crossover_is_twice_sequential():
    p = analytical.predict_pair(job("A", 0.05, 0.05), job("B", 0.05, 0.05))
    assert p.normalised["sequential"] == pytest.approx(1.0)
    assert p.normalised["crossover"] == pytest.approx(2.0, rel=1e-3)
    assert p.normalised["crossover_turn"] == pytest.approx(2.0)
    assert p.normalised["naive"] < 1.9  # a random phase wastes part of the overlap
    assert p.recommendation == "cross" and p.expected_gain == pytest.approx(2.0, rel=1e-3)


def test_no_communication_means_no_gain():
    p = analytical.predict_pair(job("A", 0.05, 0.0), job("B", 0.03, 0.0))
    for policy in PREDICTED:
        assert p.normalised[policy] == pytest.approx(1.0, rel=1e-3)
    assert p.recommendation == "do not pair"


def test_coprime_periods_shift_gains_little_but_harmonic_periods_do():
    a = job("A", 0.05, 0.05)
    coprime = analytical.predict_pair(a, job("B", 0.07, 0.07))  # periods 10:14 = 5:7
    harmonic = analytical.predict_pair(a, job("B", 0.15, 0.05))  # periods 1:2
    assert coprime.normalised["shift"] / coprime.normalised["naive"] < 1.05
    assert coprime.hyperperiod_s == pytest.approx(0.7)
    assert harmonic.normalised["shift"] / harmonic.normalised["naive"] > 1.10
    assert coprime.normalised["crossover"] > coprime.normalised["shift"] * 1.05


def test_crossover_round_matches_the_per_round_formula():
    a = job("A", 0.05, 0.02, handoff_s=0.001)
    b = job("B", 0.03, 0.09, handoff_s=0.001)
    times = analytical.PairTimes.from_profiles([(a, b)])
    expected = max(0.05 + 0.001, 0.09) + max(0.03 + 0.001, 0.02)
    assert analytical.crossover_round_s(times)[0] == pytest.approx(expected)


def test_variance_lengthens_the_crossed_round():
    a = job("A", 0.05, 0.05, compute_std_s=0.01, comm_std_s=0.01)
    times = analytical.PairTimes.from_profiles([(a, job("B", 0.05, 0.05))])
    assert analytical.crossover_round_s(times, samples=4000)[0] > 0.1 * 1.01


def test_handoff_cost_is_paid_twice_per_round_under_the_lease():
    work = np.array([[[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]])
    rates = fluid.colocated_steps_per_s(work, np.array([0.3]), leased=True,
                                        handoff_s=np.array([[0.1, 0.1]]))
    assert rates[0] == pytest.approx([1 / 2.2, 1 / 2.2])


def test_free_sharing_keeps_the_start_offset():
    work = np.array([[[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]] * 2)
    rates = fluid.colocated_steps_per_s(work, np.array([0.0, 1.0]))
    assert rates[0] == pytest.approx([0.25, 0.25])  # in phase: both always contend
    assert rates[1] == pytest.approx([0.5, 0.5])    # out of phase: no contention


def test_recommend_threshold_and_bad_inputs():
    choice, reason = analytical.recommend(
        {"sequential": 1.0, "naive": 1.0, "shift": 1.2, "crossover": 1.1})
    assert choice == "shift" and "+20.0%" in reason
    assert analytical.recommend({"sequential": 1.0, "naive": 1.0, "shift": 1.03,
                                 "crossover": 1.04})[0] == "do not pair"
    # Naive already takes the gain: crossing must beat it by min_gain, not just match it.
    choice, reason = analytical.recommend({"sequential": 1.0, "naive": 1.8, "shift": 1.8,
                                           "crossover": 1.85})
    assert choice == "naive" and "+80.0% over sequential" in reason
    assert analytical.recommend({"sequential": 1.0, "naive": 1.5, "shift": 1.5,
                                 "crossover": 1.8})[0] == "cross"
    # Naive below the bar but crossing above it: cross.
    assert analytical.recommend({"sequential": 1.0, "naive": 1.03, "crossover": 1.09})[0] \
        == "cross"
    # Measured comparisons have no shift: the same rule names their winner.
    assert analytical.recommend({"sequential": 1.0, "naive": 1.78, "crossover": 1.76})[0] \
        == "naive"
    with pytest.raises(ValueError, match="itself"):
        analytical.predict_pair(job("A", 0.05, 0.05), job("A", 0.05, 0.05))
    with pytest.raises(ValueError, match="at least one pair"):
        analytical.predict_pairs([])
    with pytest.raises(ValueError, match="shape"):
        fluid.colocated_steps_per_s(np.ones((2, 3)), np.zeros(2))


@pytest.mark.parametrize("n_jobs", [2, 3, 4])
@pytest.mark.parametrize("compute,comm", [(0.05, 0.02), (0.05, 0.05), (0.03, 0.06)])
def test_fifo_round_matches_the_simulator(n_jobs, compute, comm):
    from crossover_tf_planner.analytical import fifo_round_s, fifo_speedup_over_sequential
    from crossover_tf_planner.simulator import SimJob, simulate
    profiles = [JobProfile(name=f"J{i}", compute_s=compute, comm_s=comm) for i in range(n_jobs)]
    jobs = [SimJob(p, (0, 1), "crossover", start_s=i * compute)
            for i, p in enumerate(profiles)]
    result = simulate(jobs, n_hosts=2, steps=60)
    simulated_round = 1.0 / min(result.steps_per_s.values())
    assert simulated_round == pytest.approx(fifo_round_s(profiles), rel=0.02)
    assert fifo_speedup_over_sequential(profiles) == pytest.approx(
        n_jobs * (compute + comm) / fifo_round_s(profiles))


def test_fifo_round_bounds():
    from crossover_tf_planner.analytical import fifo_round_s
    equal = [JobProfile(name=f"J{i}", compute_s=1.0, comm_s=2.0) for i in range(3)]
    assert fifo_round_s(equal) == pytest.approx(6.0)  # the links: 3 allreduces of 2 s
    assert fifo_round_s(equal[:1]) == pytest.approx(3.0)  # alone: C + M
    with pytest.raises(ValueError, match="at least one job"):
        fifo_round_s([])


def test_cpu_model_makes_naive_work_conserving_and_charges_comm_cpu():
    a = JobProfile(name="A", compute_s=0.5, comm_s=0.5, handoff_s=0.001, comm_cpu_s=0.05)
    b = JobProfile(name="B", compute_s=0.5, comm_s=0.5, handoff_s=0.001, comm_cpu_s=0.05)
    cpu = analytical.predict_pair(a, b, model="cpu", samples=0)
    # Round: both computes plus both allreduces' CPU work on the core = 1.1 s; solo step 1 s.
    assert cpu.normalised["naive"] == pytest.approx(2 * 1.0 / 1.1)
    assert cpu.normalised["shift"] == pytest.approx(cpu.normalised["naive"])
    assert cpu.normalised["crossover"] == pytest.approx(2 * 1.0 / 1.102)
    assert cpu.recommendation == "naive" and cpu.device_model == "cpu"
    gpu = analytical.predict_pair(a, b, model="gpu", samples=0)
    assert gpu.normalised["naive"] < 1.5 < gpu.normalised["crossover"]  # random phases
    assert gpu.recommendation in ("cross", "shift")  # a scheduler pays on a GPU
    with pytest.raises(ValueError, match="unknown device model"):
        analytical.predict_pair(a, b, model="tpu")


def test_cpu_model_naive_uses_the_measured_cpu_and_crossover_the_holds():
    # Each step holds the device 0.5 s but uses only 0.4 s of CPU (it waits inside the hold);
    # its allreduce takes 0.25 s, 0.02 s of it CPU.
    a = JobProfile(name="A", compute_s=0.5, comm_s=0.25, comm_cpu_s=0.02, cpu_s=0.4)
    b = dataclasses.replace(a, name="B")
    p = analytical.predict_pair(a, b, model="cpu", samples=0)
    # Naive: the core does 0.8 s of CPU per round; crossover serialises 2 x 0.5 s holds, each
    # carrying the other's 0.02 s allreduce CPU.
    assert p.normalised["naive"] == pytest.approx(2 * 0.75 / 0.8)
    assert p.normalised["crossover"] == pytest.approx(2 * 0.75 / 1.04)
    assert p.recommendation == "naive"
    assert a.cpu_demand_s == 0.4 and dataclasses.replace(a, cpu_s=0.0).cpu_demand_s == 0.52
    # N jobs: the same bounds.
    from crossover_tf_planner.analytical import fifo_round_s, naive_round_s
    assert naive_round_s([a, b, a]) == pytest.approx(1.2)
    assert fifo_round_s([a, b, a], cpu=True) == pytest.approx(1.5 + 0.06)
    assert fifo_round_s([a, b, a]) == pytest.approx(1.5)
