"""plan.py --mode=link_sharing on a real emulated cluster, in a module of its own so that its
timed probe does not share the machine's cores with test_emulated_cluster.py's job tests."""
from __future__ import annotations

import signal

import pytest
from absl import flags

from experiments import plan
from experiments.cluster import shell

NETNS_OK, NETNS_REASON = shell.netns_usable()
TEST_TIMEOUT_S = 150  # two probe runs of a few seconds each, plus start-up


def _expire(signum, frame):
    raise TimeoutError(f"test exceeded {TEST_TIMEOUT_S}s")


@pytest.mark.netns
@pytest.mark.multiprocess
@pytest.mark.skipif(not NETNS_OK, reason=f"needs root and ip netns: {NETNS_REASON}")
def test_two_jobs_allreduces_share_the_link(tmp_path):
    """One job's 1 MB allreduces alone on a 20 Mbit/s link, then two jobs' at once from a
    shared start. Each shared allreduce is slower than a solo one (the link is really shared),
    and together they move about what one job moves alone."""
    flag_values = flags.FlagValues()
    plan.define_flags(flag_values)
    flag_values.mark_as_parsed()
    previous = signal.signal(signal.SIGALRM, _expire)
    signal.alarm(TEST_TIMEOUT_S)
    try:
        out = plan.run(flag_values, {"mode": "link_sharing", "calibrate_mbit": 20.0,
                                     "calibrate_mb": 1.0, "calibrate_seconds": 3.0,
                                     "out_dir": str(tmp_path)})
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    measured = out["result"]
    assert set(measured["shared_s_per_allreduce"]) == {"link_a", "link_b"}
    for shared in measured["shared_s_per_allreduce"].values():
        assert shared > 1.3 * measured["solo_s_per_allreduce"]
    assert 0.6 < measured["combined_throughput"] < 1.6
    assert measured["overlap_s"] > 2.0
    assert "Combined throughput over one job's alone" in out["markdown"]
