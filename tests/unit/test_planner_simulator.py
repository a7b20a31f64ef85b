"""Discrete-event simulator: conservation, agreement with hand cases, bad inputs."""

import pytest

from crossover_tf_planner.profile import JobProfile
from crossover_tf_planner.simulator import SimJob, simulate


def noisy(name, compute, comm):
    return JobProfile(name=name, compute_s=compute, comm_s=comm, compute_std_s=0.1 * compute,
                      comm_std_s=0.1 * comm, handoff_s=2e-4)


def three_jobs(policy):
    """Two jobs crossing on hosts 0-1 and a third sharing host 1's device and link."""
    return [SimJob(noisy("A", 0.05, 0.04), (0, 1), policy),
            SimJob(noisy("B", 0.03, 0.06), (0, 1), policy),
            SimJob(noisy("C", 0.04, 0.05), (1, 2), policy)]


def test_crossover_never_lets_two_jobs_hold_a_device():
    result = simulate(three_jobs("crossover"), n_hosts=3, steps=80)
    assert max(result.device_peak_flows.values()) == 1
    for host, holds in result.lease_holds.items():
        holds = sorted(holds)
        assert len(holds) > 80
        for (_, end, _), (start, _, _) in zip(holds, holds[1:]):
            assert start >= end - 1e-12, f"host {host} held by two jobs at once"
    assert max(result.link_peak_rate.values()) <= 1 + 1e-9


def test_naive_shares_devices_but_never_overfills_a_link():
    result = simulate(three_jobs("naive"), n_hosts=3, steps=80)
    assert result.device_peak_flows[1] == 3  # the conservation check above can fail
    assert max(result.link_peak_rate.values()) <= 1 + 1e-9
    assert result.link_peak_rate[1] == pytest.approx(1.0)


@pytest.mark.parametrize("policy,expected", [("sequential", 1.0), ("crossover", 2.0),
                                             ("shift", 2.0)])
def test_deterministic_equal_jobs_match_the_hand_computation(policy, expected):
    a = JobProfile(name="A", compute_s=0.05, comm_s=0.05)
    b = JobProfile(name="B", compute_s=0.05, comm_s=0.05)
    jobs = [SimJob(a, (0, 1), policy), SimJob(b, (0, 1), policy, start_s=0.05)]
    result = simulate(jobs, n_hosts=2, steps=40)
    assert sum(result.normalised.values()) == pytest.approx(expected, rel=1e-6)


def test_simulator_bad_inputs():
    a = JobProfile(name="A", compute_s=0.05, comm_s=0.05)
    with pytest.raises(ValueError, match="empty"):
        simulate([], n_hosts=2)
    with pytest.raises(ValueError, match="outside"):
        simulate([SimJob(a, (0, 5), "naive")], n_hosts=2)
    with pytest.raises(ValueError, match="mixes policies"):
        simulate([SimJob(a, (0,), "crossover"),
                  SimJob(JobProfile(name="B", compute_s=0.05, comm_s=0.05), (0,), "naive")],
                 n_hosts=1)
    with pytest.raises(ValueError, match="policy"):
        SimJob(a, (0,), "magic")
    with pytest.raises(ValueError, match="distinct"):
        SimJob(a, (0, 0), "naive")
