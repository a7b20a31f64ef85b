"""The link-sharing probe's arithmetic (experiments/probes/comm_cpu.sharing): which
allreduces both jobs overlapped, and how much a starved job moved."""
from __future__ import annotations


import pytest



# -- link sharing probe ----------------------------------------------------------------------------
def test_link_sharing_counts_only_the_allreduces_both_jobs_overlapped():
    """Alone 0.4 s per allreduce; together 0.8 s each while both run (the link split evenly:
    combined throughput 1.0). Job a's last allreduces, after b finished, run alone at 0.4 s
    and must not count."""
    from experiments.probes import comm_cpu
    solo = {"megabytes": 1.0, "wall_s_per_allreduce": 0.4}
    a_ends = [100.0 + 0.8 * k for k in range(1, 21)] + [116.0 + 0.4 * k for k in range(1, 6)]
    b_ends = [100.5 + 0.8 * k for k in range(1, 20)]
    shared = {"a": {"spans_s": [(e - (0.8 if e <= 116.0 else 0.4), e) for e in a_ends]},
              "b": {"spans_s": [(e - 0.8, e) for e in b_ends]}}
    assert (shared["a"]["spans_s"][0][0], shared["b"]["spans_s"][0][0]) == pytest.approx(
        (100.0, 100.5))
    out = comm_cpu.sharing(solo, shared)
    assert out["shared_s_per_allreduce"] == pytest.approx({"a": 0.8, "b": 0.8})
    assert out["combined_throughput"] == pytest.approx(1.0)
    assert out["overlap_s"] == pytest.approx(b_ends[-1] - 100.5)
    shared["b"]["spans_s"] = [(100.5, 100.6)]  # b barely started: nothing to compare
    with pytest.raises(RuntimeError, match="too little overlap"):
        comm_cpu.sharing(solo, shared)


def test_link_sharing_counts_the_fractions_of_an_allreduce_a_starved_job_moved():
    """TCP shares unfairly: a runs at 0.5 s per allreduce over [100, 103], b moves one
    allreduce in 2 s then another that is half done when a finishes. b moved 1.5 allreduces in
    the 3 s window (2 s each), not 'one, too few to measure'."""
    from experiments.probes import comm_cpu
    solo = {"megabytes": 1.0, "wall_s_per_allreduce": 0.4}
    shared = {"a": {"spans_s": [(100.0 + 0.5 * k, 100.5 + 0.5 * k) for k in range(6)]},
              "b": {"spans_s": [(100.0, 102.0), (102.0, 104.0)]}}
    out = comm_cpu.sharing(solo, shared)
    assert out["overlap_s"] == pytest.approx(3.0)
    assert out["shared_s_per_allreduce"] == pytest.approx({"a": 0.5, "b": 2.0})
    assert out["combined_throughput"] == pytest.approx(0.4 / 0.5 + 0.4 / 2.0)


