"""Hand-made job stats and a fake cluster for the comparison's unit tests (tests/unit/
test_compare_*.py): no cluster, no TensorFlow jobs. A pytest plugin (tests/conftest.py loads
it): a module that runs compare.run marks itself `usefixtures("compare_flags")`, and a test
that needs the fake cluster asks for `fake_runs`."""
from __future__ import annotations

import contextlib

import pytest

from crossover_tf_planner.comm_cost import CommCpu, LinkContention
from crossover_tf_planner.job_stats import JobStats
from experiments import compare
from experiments.analysis import planning
from experiments.comparison import calibrate, scenarios
from experiments.comparison import summary as summary_lib
from experiments.comparison.calibration import CommFit

MS = 1e-3


def job_stats(job: str, period_s: float, compute_s: float, comm_s: float, start_s: float = 0.0,
           steps: int = 20, batch: int = 32) -> JobStats:
    """A job stepping every period_s; its lease timeline has compute, comm and a 10% apply."""
    apply_s = 0.1 * compute_s
    starts = [start_s + i * period_s for i in range(steps)]
    phases = [[int(1e9 * t) for t in (s, s + compute_s, s + compute_s + comm_s,
                                      s + compute_s + comm_s, s + compute_s + comm_s + apply_s)]
              for s in starts]
    return JobStats(job=job, global_batch_size=batch, steps=steps, timed_steps=steps - 1,
                    step_time_s=period_s, images_per_s=batch / period_s,
                    timed_wall_s=(steps - 1) * period_s,
                    step_end_ns=[int(1e9 * (s + period_s)) for s in starts], phases_ns=phases,
                    compute_s=compute_s, comm_s=comm_s, apply_s=apply_s)


def scenario_stats(compute_s: float, comm_s: float, crossover_speedup: float
                    ) -> dict[str, dict[str, JobStats]]:
    """sequential at the solo step, naive 1.2x and crossover `crossover_speedup`x the
    sequential aggregate (each job at half its solo rate times the speedup); naive_env and
    crossover_env 1.1x and 1.05x their plain scenario, crossover_turn 1.15x crossover, shift
    1.25x sequential."""
    solo = 1.1 * compute_s + comm_s
    return {"sequential": {j: job_stats(j, solo, compute_s, comm_s) for j in "AB"},
            "naive": {j: job_stats(j, 2 * solo / 1.2, compute_s, comm_s) for j in "AB"},
            "crossover": {j: job_stats(j, 2 * solo / crossover_speedup, compute_s, comm_s)
                          for j in "AB"},
            "crossover_env": {j: job_stats(j, 2 * solo / (1.05 * crossover_speedup), compute_s,
                                        comm_s) for j in "AB"},
            "naive_env": {j: job_stats(j, 2 * solo / (1.1 * 1.2), compute_s, comm_s)
                          for j in "AB"},
            "shift": {j: job_stats(j, 2 * solo / 1.25, compute_s, comm_s) for j in "AB"},
            "crossover_turn": {j: job_stats(j, 2 * solo / (1.15 * crossover_speedup), compute_s,
                                         comm_s) for j in "AB"}}


def trial_results(speedups: list[float], computes: list[float] | None = None,
                   comm_s: float = 0.1) -> list[dict]:
    """Trials of the given crossover speedups (and per-trial solo compute, 0.1 s each by
    default), each with the planner's check."""
    results = []
    for trial, (speedup, compute_s) in enumerate(zip(speedups, computes or [0.1] * len(speedups))):
        summary = summary_lib.summarise(scenario_stats(compute_s, comm_s, speedup), 1,
                                        {"trial": trial})
        summary = planning.with_planner(summary)
        results.append(summary)
    return results


class FakeCluster(contextlib.AbstractContextManager):
    """Stands in for EmulatedCluster: emulated, at a bandwidth, describing itself."""

    def __init__(self, bandwidth_mbit):
        self.bandwidth_mbit, self.is_emulated, self.fallback_reason = bandwidth_mbit, True, ""

    def __exit__(self, *exc_info):
        return None

    def describe(self):
        return {"bandwidth_mbit": self.bandwidth_mbit}


LINK = CommFit(fixed_s=20 * MS, per_mbit_s=5.0)  # the fake link's M(B)
COMPUTE_S = 0.1 / 1.1  # device time 100 ms with the 10% apply
NOISY_COMM_S: dict[float, float] = {}  # bandwidth -> M overriding LINK (a noisy measurement)
DRIFT_RUNS: list[str] = []  # the drift probe's runs (fake_runs keeps them out of its calls)
START_SHIFTS: dict[str, dict[str, float]] = {}  # run name -> the start shifts it was given


def install_fake_runs(monkeypatch) -> list[str]:
    """Replaces the cluster and the jobs: M follows LINK at the cluster's bandwidth; the
    crossover speed-up differs per trial (1.4, 1.6, 1.2, ...). Returns the list every run's
    name is recorded in (the test's fake_runs fixture); START_SHIFTS gets each shift run's
    start shifts."""
    calls = []

    def run_scenario(cluster, c, name, out, run_name="", jobs=("A", "B"), steps=None,
                     start_shifts=None):
        (DRIFT_RUNS if out.name == "drift_probe" else calls).append(run_name)
        if start_shifts is not None:
            START_SHIFTS[run_name] = dict(start_shifts)
        comm_s = NOISY_COMM_S.get(cluster.bandwidth_mbit, LINK.comm_s(cluster.bandwidth_mbit))
        trial = int(run_name[1:].split("_")[0]) if run_name.startswith("t") else 0
        stats = scenario_stats(COMPUTE_S, comm_s, 1.4 + 0.2 * ((trial + 1) % 3 - 1))[name]
        return {job: stats[job] for job in jobs}

    def measure(bandwidth, megabytes, num_hosts, log_dir, backend):
        calls.append(f"comm_cpu@{bandwidth:.4g}mbit:{megabytes:.4g}MB")
        return CommCpu(cpu_per_wait_s=0.05, cpu_s_per_mb=0.004, bandwidth_mbit=bandwidth)

    def measure_contention(bandwidth, megabytes, seconds, num_hosts, log_dir, backend):
        calls.append(f"contention@{bandwidth:.4g}mbit:{megabytes:.4g}MB")
        return LinkContention(shared_efficiency=0.85, compute_slowdown=1.05,
                              bandwidth_mbit=bandwidth)

    from experiments.probes import comm_cpu
    DRIFT_RUNS.clear()
    START_SHIFTS.clear()
    monkeypatch.setattr(calibrate, "cluster", lambda c, bandwidth: FakeCluster(bandwidth))
    monkeypatch.setattr(scenarios, "run_scenario", run_scenario)
    monkeypatch.setattr(comm_cpu, "measure", measure)
    monkeypatch.setattr(comm_cpu, "measure_contention", measure_contention)
    return calls


@pytest.fixture
def compare_flags():
    """compare.run's absl flags, defined (idempotently) before the test."""
    compare.define_flags()


@pytest.fixture
def fake_runs(monkeypatch):
    return install_fake_runs(monkeypatch)
