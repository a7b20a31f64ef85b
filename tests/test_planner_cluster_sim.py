"""Cluster extrapolation: 64 hosts and 32 jobs, quickly, with conservation."""

import time

import pytest

from crossover_tf_planner import cluster_sim


def test_64_hosts_32_jobs_runs_fast_and_crossing_pays():
    profiles = cluster_sim.synthetic_profiles(32, seed=1)
    started = time.perf_counter()
    report = cluster_sim.run_cluster(profiles, 64, steps=30,
                                 policies=("sequential", "crossover", "planned"))
    assert time.perf_counter() - started < 20
    rows = report["policies"]
    assert report["groups"] == 16 and report["hosts_per_job"] == 4
    assert rows["crossover"]["max_device_flows"] == 1
    assert all(row["max_link_rate"] <= 1 + 1e-9 for row in rows.values())
    assert rows["planned"]["simulated_normalised_total"] > \
        1.2 * rows["sequential"]["simulated_normalised_total"]
    for row in rows.values():
        assert abs(row["analytical_vs_simulated_error_pct"]) < 15


def test_cluster_bad_inputs():
    with pytest.raises(ValueError, match="n_jobs"):
        cluster_sim.synthetic_profiles(0)
    profiles = cluster_sim.synthetic_profiles(8)
    with pytest.raises(ValueError, match="do not fit"):
        cluster_sim.place(cluster_sim.group_jobs(profiles), profiles, 2, "crossover")
