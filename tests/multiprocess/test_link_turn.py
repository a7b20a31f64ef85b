"""Link turns: the jobs of a crossover group allreduce one at a time, in one global order.

The C++ core's own tests (ops/testing/device_lease_test.cc, run by test_lease_core.py) cover the
order between processes, late joiners, dead and paused peers. Here: the Python surface, and
two real crossed Horovod jobs (horovodrun --gloo, 2 ranks each) that take turns.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

from conftest import BACKENDS, REPO_ROOT, run_bounded, run_worker_pair
from step_crossings import check_turns_inside_steps, overlapping_turns, turn_intervals
from test_strategy import WORKER, _check, _load, assert_trains_like_reference

STEPS, EPOCHS = 20, 2


def _turn(group: str, position: int = 0, jobs: int = 2, agree=lambda n: n, wait_s: float = 5.0,
          barrier=lambda: None):
    from crossover_tf import lease as lease_lib
    return lease_lib.LinkTurn(lease_lib.DeviceLease(group, "dev"), position, jobs, agree, wait_s,
                              barrier)


@pytest.mark.parametrize("position, jobs", [(2, 2), (-1, 2), (0, 0), (0, 9), (True, 2),
                                            (0.5, 2)])
def test_bad_positions_are_clear_errors(position, jobs):
    from crossover_tf.lease import validate_link_turn
    with pytest.raises(ValueError, match="position in"):
        validate_link_turn(position, jobs)


def test_a_lone_job_takes_turns_without_waiting(lease_group):
    """Joining with nobody else turning is unconstrained, so offset 0; otherwise the offset is
    what the job's ranks agree on. Wait and done pass tensors through unchanged; stats and
    timeline count each turn."""
    import tensorflow as tf
    from crossover_tf.lease.link_turn import UNCONSTRAINED
    agreed = []
    turn = _turn(lease_group, agree=lambda n: agreed.append(n) or n)
    with pytest.raises(tf.errors.InvalidArgumentError, match="not joined"):
        turn.wait([tf.constant(1.0)])
    assert turn.join() == 0 and agreed == [UNCONSTRAINED] and turn.joined
    turn.leave()
    turn = _turn(lease_group, agree=lambda n: -3)   # another rank saw an earlier turn
    assert turn.join() == -3
    x = {"a": tf.constant([1.0, 2.0]), "b": tf.constant(3)}
    for _ in range(3):
        out = turn.done(turn.wait(x))
        np.testing.assert_array_equal(out["a"], [1.0, 2.0])
        assert int(out["b"]) == 3
    stats = turn.stats()
    assert (stats.turns, stats.waited, stats.skipped) == (3, 0, 0)
    events = turn.timeline()
    assert events.shape == (3, 4) and np.all(events[:, 2] >= events[:, 1])
    assert np.all(events[:, 3] == 0)
    turn.pause()
    assert not turn.joined
    turn.resume()  # joins again: next index is its own (left) position, nobody else turns
    assert turn.joined
    turn.leave()
    turn.resume()  # left for good: no-op
    assert not turn.joined


def test_join_lines_the_ranks_up_first_and_leaves_if_they_cannot_agree(lease_group):
    """The proposal is read only after the barrier (a rank that came early would propose an
    index the others have long passed); a join whose agreement fails leaves, so the provisional
    offset it took meanwhile holds nobody up."""
    import tensorflow as tf
    calls = []
    turn = _turn(lease_group, barrier=lambda: calls.append("barrier"),
                 agree=lambda n: calls.append("agree") or n)
    turn.join()
    assert calls == ["barrier", "agree"] and turn.joined
    turn.leave()

    def fail(n: int) -> int:
        raise KeyboardInterrupt
    turn = _turn(lease_group, agree=fail)
    with pytest.raises(KeyboardInterrupt):
        turn.join()
    assert not turn.joined
    with pytest.raises(tf.errors.InvalidArgumentError, match="not joined"):
        turn.wait([tf.constant(1.0)])


@pytest.mark.slow
def test_a_second_job_at_the_same_position_is_refused(lease_group, child_env):
    """Two jobs claiming one position would silently share a slot in the order: an error."""
    turn = _turn(lease_group, position=1)
    turn.join()
    code = ("from crossover_tf import lease\n"  # _turn's lease and turn, in another process
            f"lease.LinkTurn(lease.DeviceLease({lease_group!r}, 'dev'), 1, 2, lambda n: n, 5.0,"
            " lambda: None).join()")
    result = run_bounded([sys.executable, "-c", code], child_env, timeout=120)
    assert result.returncode != 0
    assert "link turn position 1" in result.stdout and "is taken" in result.stdout
    turn.leave()


def test_strategy_checks_link_turn_settings():
    import crossover_tf
    from crossover_tf import LeaseOptions, LinkTurnOptions
    with pytest.raises(ValueError, match="need a group"):
        crossover_tf.CrossoverStrategy("", link_turn=LinkTurnOptions(position=0))
    with pytest.raises(ValueError, match="position in"):
        crossover_tf.CrossoverStrategy("g", lease=LeaseOptions(jobs=2),
                                       link_turn=LinkTurnOptions(position=2))
    with pytest.raises(ValueError, match="timeout"):
        LinkTurnOptions(position=0, wait_s=0)


@pytest.mark.parametrize("priority", ["primary", "secondary"])
def test_priority_with_link_turn_is_refused(priority):
    """Turns alternate strictly, so a primary's allreduce k would wait for its secondary's
    k-1: priority and link turns contradict each other, and the strategy says so."""
    import crossover_tf
    with pytest.raises(ValueError, match="priority.*link_turn|link_turn.*priority"):
        crossover_tf.CrossoverStrategy("g", lease=crossover_tf.LeaseOptions(priority=priority),
                                       link_turn=crossover_tf.LinkTurnOptions(position=0))


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_crossed_jobs_allreduce_one_at_a_time(tmp_path, lease_group, child_env, backend):
    """Two crossed jobs (2 ranks each, two epochs: they leave and rejoin at the epoch's end)
    train like plain Keras; on each host their allreduces do not overlap (but for one per
    join), go in the same order on both hosts, and each sits between its compute and apply.
    (They alternate while both jobs step; tiny steps like these also run alone for a while
    when one job is slower through its epoch's end, so the test does not count switches.)"""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    args = ["--steps", str(STEPS), "--epochs", str(EPOCHS), "--barrier", f"{barrier}:4",
            "--group", lease_group, "--jobs", "2", "--fit_only", "--backend", backend]
    run_worker_pair(WORKER, tmp_path, backend, args, child_env, a=("--link_turn", "0"),
                    b=("--link_turn", "1"))
    _check(run_bounded([sys.executable, WORKER, str(tmp_path / "ref_RANK.json"), "--reference",
                        "--steps", str(STEPS), "--epochs", str(EPOCHS)], child_env, 240))
    crossed_a, crossed_b = _load(tmp_path, "a", 2), _load(tmp_path, "b", 2)
    (reference,) = _load(tmp_path, "ref", 1)
    for crossed in (crossed_a, crossed_b):
        assert_trains_like_reference(crossed, reference)

    orders = []
    for rank in range(2):   # rank r of A and rank r of B share host r's device cpu<r>
        a, b = crossed_a[rank], crossed_b[rank]
        for r in (a, b):
            check_turns_inside_steps(r, STEPS)
        both = sorted([(s, e, "A") for s, e in turn_intervals(a)] +
                      [(s, e, "B") for s, e in turn_intervals(b)])
        # A job that joins (each epoch) takes the turn before the other's next one, which may
        # already be under way on this host: at most one overlap per join, by design (see
        # lease/link_turn.py); without turns nearly every allreduce overlaps.
        overlaps = overlapping_turns(a, b)
        assert overlaps <= 2 * EPOCHS, f"host {rank}: {overlaps} allreduces overlapped"
        order = "".join(job for _, _, job in both)
        orders.append(order)
    # The same order on both hosts, but where a join let two turns swap (see above).
    differ = sum(x != y for x, y in zip(*orders))
    assert len(orders[0]) == len(orders[1]) and differ <= 4 * EPOCHS, orders
    assert sum(r["link_turn_stats"]["waited"] for r in crossed_a + crossed_b) > 0


def test_python_limits_are_the_cores():
    """Two limits, two names, each the C++ core's own (ops/core/lease_types.h): how many jobs a
    group may declare (members of one lease) and how many may take link turns."""
    from crossover_tf.lease import group_join, link_turn
    header = (REPO_ROOT / "ops" / "core" / "lease_types.h").read_text()
    assert f"constexpr int kMaxProcesses = {group_join.MAX_GROUP_JOBS};" in header
    assert f"constexpr int kMaxLinkTurnJobs = {link_turn.MAX_LINK_TURN_JOBS};" in header
