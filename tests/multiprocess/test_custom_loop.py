"""Custom GradientTape loops crossed with strategy.hold_device and strategy.gradient_tape:
real Horovod processes (horovodrun --gloo on localhost), 2 ranks per job."""
from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest

from conftest import (BACKENDS, WORKERS, horovodrun_command, launch_command, run_alongside,
                      run_bounded)
from crossover_tf.profiling import phases as timeline
from step_crossings import check_turns_inside_steps, overlap_steps, overlapping_turns

WORKER = str(WORKERS / "custom_loop_worker.py")
STEPS = 20


def _load(tmp_path: pathlib.Path, prefix: str, ranks: int = 2) -> list[dict]:
    return [json.loads((tmp_path / f"{prefix}_{r}.json").read_text()) for r in range(ranks)]


def _ok(result) -> None:
    assert result.returncode == 0, result.stdout[-6000:]


def _holds(events: list) -> np.ndarray:
    """[n, 2] acquired/released ns of every completed hold."""
    events = np.asarray(events, dtype=np.int64).reshape(-1, 4)
    return events[events[:, 2] > 0][:, 1:3]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("link_turns", [False, True], ids=["holds", "link_turns"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_crossed_custom_loop_trains_like_plain_horovod_and_never_holds_at_once(
        tmp_path, lease_group, child_env, backend, link_turns):
    """Under each backend the crossed loop is that library's plain loop; with link turns too
    (no Keras step joins them: the tape does, on its first allreduce)."""
    barrier = tmp_path / "barrier"
    crossed = ["--group", lease_group, "--jobs", "2", "--steps", str(STEPS), "--barrier",
               f"{barrier}:4", "--backend", backend]
    turn_a, turn_b = (["--link_turn", "0"], ["--link_turn", "1"]) if link_turns else ([], [])
    for result in run_alongside(
            launch_command(backend, 2, sys.executable, WORKER, str(tmp_path / "a_RANK.json"),
                           *crossed, *turn_a),
            launch_command(backend, 2, sys.executable, WORKER, str(tmp_path / "b_RANK.json"),
                           *crossed, *turn_b), child_env, timeout=240):
        _ok(result)
    _ok(run_bounded(launch_command(backend, 2, sys.executable, WORKER,
                                   str(tmp_path / "plain_RANK.json"), "--plain",
                                   "--steps", str(STEPS), "--backend", backend),
                    child_env, 240))
    a, b, plain = _load(tmp_path, "a"), _load(tmp_path, "b"), _load(tmp_path, "plain")

    # The crossed loop is the plain Horovod loop, step by step and weight by weight.
    for job in (a, b):
        for crossed_rank, plain_rank in zip(job, plain):
            assert len(crossed_rank["losses"]) == STEPS
            np.testing.assert_allclose(crossed_rank["losses"], plain_rank["losses"],
                                       rtol=1e-6, atol=1e-7)
            for w_crossed, w_plain in zip(crossed_rank["weights"], plain_rank["weights"]):
                np.testing.assert_allclose(w_crossed, w_plain, rtol=1e-6, atol=1e-7)
    assert plain[0]["losses"][-1] < plain[0]["losses"][0]

    for rank in range(2):  # rank r of A and of B share device cpu<r>
        # Two holds a step, compute then apply, and the allreduce between them (outside).
        phases = [timeline.step_phases(job[rank]["timeline"]) for job in (a, b)]
        assert all(len(p) == STEPS for p in phases)
        assert all((p[:, 2] >= p[:, 1]).all() and (p[:, 3] >= p[:, 2]).all() for p in phases)
        assert all(job[rank]["lease_stats"]["acquires"] == 2 * STEPS for job in (a, b))
        assert not any(job[rank]["lease_stats"]["held"] for job in (a, b))
        holds = sorted([*map(tuple, _holds(a[rank]["timeline"])),
                        *map(tuple, _holds(b[rank]["timeline"]))])
        overlapping = [(x, y) for x, y in zip(holds, holds[1:]) if x[1] > y[0]]
        assert not overlapping, f"rank {rank}: holds at once {overlapping[:3]}"
        if link_turns:  # one turn a step, inside it; one overlap per join at most, by design
            for job in (a, b):
                check_turns_inside_steps(job[rank], STEPS)
            overlaps = overlapping_turns(a[rank], b[rank])
            assert overlaps <= 2, f"host {rank}: {overlaps} allreduces overlapped"
    crossings = sum(overlap_steps(timeline.step_phases(a[r]["timeline"]),
                                  timeline.step_phases(b[r]["timeline"]))
                    for r in range(2))
    print(f"A's computes during B's allreduce: {crossings} of {2 * STEPS}")


@pytest.mark.multiprocess
@pytest.mark.slow
def test_custom_loop_mistakes_are_refused_clearly(tmp_path, lease_group, child_env):
    """gradient() without a hold, and a Horovod collective inside the hold, fail at trace
    time with what to do instead; a nested XLA function inside the hold is fine."""
    # Two ranks: with one, Horovod's tape has nothing to allreduce and writes no collective.
    _ok(run_bounded(horovodrun_command(2, sys.executable, WORKER, str(tmp_path / "m_RANK.json"),
                                       "--misuse", "--group", lease_group), child_env, 180))
    result = _load(tmp_path, "m")[0]
    misuse = result["misuse"]
    assert "outside strategy.hold_device()" in misuse["forgot_hold"]
    assert "HorovodAllreduce" in misuse["horovod_tape_in_hold"] or \
        "HorovodGroupedAllreduce" in misuse["horovod_tape_in_hold"]
    assert "inside strategy.hold_device()" in misuse["horovod_tape_in_hold"]
    assert "hvd.DistributedGradientTape" in misuse["horovod_tape_in_hold"]
    assert "HorovodAllreduce" in misuse["reduce_in_hold"]
    assert misuse["xla_compute_in_hold"] == "no error"
    assert result["lease_stats"]["acquires"] == 2 and not result["lease_stats"]["held"]
