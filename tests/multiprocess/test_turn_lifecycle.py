"""When a job joins and leaves the link turns, seen by the job beside it.

The turn is a wait for the other jobs' earlier allreduces, so a job that is in the turn table
but not stepping makes the others wait (up to link_turn_wait_s per allreduce). These tests
check the places in a fit's life where that went wrong: a join agreed on a stale proposal, a
second fit joining before its first step, and a fit that ended with an error.
"""
from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest

from conftest import WORKERS, horovodrun_command, run_alongside, run_bounded

WORKER = str(WORKERS / "turn_worker.py")
pytestmark = pytest.mark.slow  # crossed Horovod jobs each


def _lifecycle(tmp_path: pathlib.Path, group: str, env: dict[str, str], scenario: str) -> dict:
    out = tmp_path / f"{scenario}.json"
    result = run_bounded([sys.executable, WORKER, "lifecycle", str(out), "--group", group,
                          "--scenario", scenario], env, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:]
    return json.loads(out.read_text())


def _assert_peer_never_waited(peer: dict) -> None:
    """The peer's turns (position 1) waited for nobody: no wait bound passed."""
    print(f"peer: {peer}")
    assert peer["turns"] == 3
    assert peer["skipped"] == 0 and peer["max_wait_s"] < 0.5, peer


@pytest.mark.multiprocess
def test_a_second_fit_joins_only_after_its_first_steps_preparation(tmp_path, lease_group,
                                                                   child_env):
    """The last epoch's end leaves the turns for a pause; the next fit must not resume that
    pause at its first epoch's begin, before its broadcast and compile, but join where the
    first fit does. A peer taking turns while the second fit is about to start (a slow first
    step) must not wait for it."""
    result = _lifecycle(tmp_path, lease_group, child_env, "refit")
    assert result["joined_at_first_batch"] == [False, False], result
    _assert_peer_never_waited(result["peer"])


@pytest.mark.multiprocess
def test_a_fit_that_fails_between_steps_leaves_the_turns(tmp_path, lease_group, child_env):
    """A callback raises (an error, then a KeyboardInterrupt, as Ctrl-C would) outside the
    train function: with the process still alive, the job is out of the turn table, and a
    peer's allreduces do not wait for it."""
    result = _lifecycle(tmp_path, lease_group, child_env, "errors")
    assert result["joined_after_error"] == [["RuntimeError", False],
                                            ["KeyboardInterrupt", False]], result
    _assert_peer_never_waited(result["peer"])


def _turns(result: dict) -> np.ndarray:
    """[turns, 4] int64: request_ns, start_ns, done_ns, skipped."""
    return np.asarray(result["turn_timeline"], dtype=np.int64).reshape(-1, 4)


def turns_in_a_row(mine: np.ndarray, peer: np.ndarray) -> np.ndarray:
    """For each pair of consecutive turns of mine, how many of peer's turns began between
    them (in strict alternation, one)."""
    starts, peer_starts = mine[:, 1], np.sort(peer[:, 1])
    return (np.searchsorted(peer_starts, starts[1:], side="left")
            - np.searchsorted(peer_starts, starts[:-1], side="left"))


# A join puts the joiner's first turn just before the others' next one, which on a host may
# already be under way, and the joiner's hosts may read its proposal an allreduce apart: a few
# of its turns can start between two of another job's. A stale proposal instead gives it every
# turn the others took while its ranks gathered: up to JOINER_STEPS here.
SKEW_S, JOINER_STEPS, MOST_IN_A_ROW = 3.0, 40, 4


@pytest.mark.multiprocess
def test_a_join_with_skewed_ranks_makes_the_running_job_wait_one_turn(tmp_path, lease_group,
                                                                      child_env):
    """Job B's rank 0 is SKEW_S slower than its rank 1 at its first epoch's end (as a rank-0
    checkpoint is), so rank 1 reaches the rejoin SKEW_S early. Job A keeps stepping all along.
    B must still join just before A's next turn: A then waits for about one of B's allreduces,
    never for a run of B's turns that A's SKEW_S of progress put before it."""
    barrier = tmp_path / "barrier"
    done = tmp_path / "b_done"
    common = ["--group", lease_group, "--jobs", "2", "--barrier", f"{barrier}:4"]
    running = horovodrun_command(2, sys.executable, WORKER, "train", str(tmp_path / "a_RANK.json"),
                                 "--link_turn", "0", "--steps", "20000", "--until", str(done),
                                 *common)
    joiner = horovodrun_command(2, sys.executable, WORKER, "train", str(tmp_path / "b_RANK.json"),
                                "--link_turn", "1", "--steps", str(JOINER_STEPS), "--epochs",
                                "2", "--rank0_epoch_end_sleep", str(SKEW_S), "--done", str(done),
                                *common)
    for result in run_alongside(running, joiner, child_env, timeout=300):
        assert result.returncode == 0, result.stdout[-6000:]
    for rank in range(2):   # rank r of A and rank r of B share host r's device cpu<r>
        a = _turns(json.loads((tmp_path / f"a_{rank}.json").read_text()))
        b = _turns(json.loads((tmp_path / f"b_{rank}.json").read_text()))
        assert len(b) == 2 * JOINER_STEPS and a[-1, 1] > b[-1, 1], "A stopped before B ended"
        assert not a[:, 3].any() and not b[:, 3].any(), "a turn passed its wait bound"
        in_a_row = turns_in_a_row(a, b)
        worst = int(np.argmax(in_a_row))
        print(f"host {rank}: {in_a_row[worst]} B turns in a row, while A went "
              f"{(a[worst + 1, 1] - a[worst, 1]) / 1e9:.3f} s between two turns")
        assert in_a_row.max() <= MOST_IN_A_ROW, \
            f"host {rank}: B took {in_a_row.max()} turns in a row"
