"""What a Keras user relies on, under CrossoverStrategy: recompiling, the initial broadcast,
evaluate/predict under the lease, no work outside the hold with jit off, XLA compiling outside
the lease, and a full user script that trains crossed exactly as plain Horovod does.

Every test runs tests/workers/keras_worker.py (one scenario each) as real processes.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

from conftest import WORKERS, horovodrun_command, run_bounded
from crossover_tf.lease import TAG_APPLY, TAG_COMPUTE, TAG_OTHER

WORKER = str(WORKERS / "keras_worker.py")
TIMEOUT_S = 150
EVAL_HOLD_MAX_S = 0.25

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]  # two-rank Horovod jobs each


def _worker(scenario: str, out: pathlib.Path, *extra: str) -> list[str]:
    return [sys.executable, WORKER, scenario, str(out), *extra]


def _run(cmd: list[str], env: dict[str, str], ranks: int = 2) -> str:
    command = horovodrun_command(ranks, *cmd) if ranks > 1 else cmd
    result = run_bounded(command, env, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-6000:]
    return result.stdout


def _load(pattern: pathlib.Path, ranks: int = 2) -> list[dict]:
    return [json.loads(pathlib.Path(str(pattern).replace("RANK", str(r))).read_text())
            for r in range(ranks)]


def _assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _changed(before: list, after: list) -> bool:
    return any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(before, after))


def _holds(timeline: list, tag: int | None = None) -> np.ndarray:
    """[n, 2] acquired_ns, yielded_ns of the completed holds (of one tag)."""
    events = np.asarray(timeline, dtype=np.int64).reshape(-1, 4)
    events = events[events[:, 2] > 0]
    if tag is not None:
        events = events[events[:, 3] == tag]
    return events[:, 1:3]


def test_recompile_rebuilds_the_step(tmp_path, lease_group, child_env):
    """Freeze/unfreeze: the backbone trains only once unfrozen; SGD(0) changes nothing."""
    out = tmp_path / "r_RANK.json"
    _run(_worker("recompile", out, "--group", lease_group), child_env)
    ranks = _load(out)
    initial = ranks[0]["initial"]  # ranks start from rank 0's weights
    for r in ranks:
        backbone, head = slice(0, 2), slice(2, 4)
        _assert_same(initial[backbone], r["frozen"][backbone])
        assert _changed(initial[head], r["frozen"][head])
        assert _changed(r["frozen"][backbone], r["unfrozen"][backbone])
        _assert_same(r["unfrozen"], r["lr0"])
    _assert_same(ranks[0]["lr0"], ranks[1]["lr0"])


def test_initial_broadcast_covers_subclassed_model_and_optimizer_slots(tmp_path, lease_group,
                                                                       child_env):
    out, ckpt = tmp_path / "b_RANK.json", tmp_path / "ckpt_RANK.keras"
    _run(_worker("broadcast", out, "--group", lease_group, "--ckpt", str(ckpt)), child_env)
    rank0, rank1 = _load(out)
    for when in ("first", "last"):
        assert len(rank0[when]["optimizer"]) > 2, "Adam's slots were never built"
        _assert_same(rank0[when]["weights"], rank1[when]["weights"])
        _assert_same(rank0[when]["optimizer"], rank1[when]["optimizer"])
    # A checkpoint restored on rank 0 only reaches every rank (trained with learning rate 0).
    import keras
    saved = keras.models.load_model(tmp_path / "ckpt_0.keras").get_weights()
    _assert_same(rank0["restored"], saved)
    _assert_same(rank1["restored"], saved)


def test_mismatched_variables_fail_clearly(tmp_path, lease_group, child_env):
    cmd = horovodrun_command(2, *_worker("mismatch", tmp_path / "m_RANK.json", "--group",
                                         lease_group))
    result = run_bounded(cmd, child_env, timeout=TIMEOUT_S)
    assert result.returncode != 0
    assert "cannot broadcast rank 0's state" in result.stdout, result.stdout[-4000:]
    assert "first mismatch at variable 0" in result.stdout
    assert "shape=(16, 32)" in result.stdout and "shape=(16, 33)" in result.stdout


def test_jit_off_runs_no_step_op_outside_the_hold(tmp_path, lease_group, child_env):
    """A peer holds the device when training starts; ops that do not depend on the batch (the
    regulariser, the learning-rate schedule) must still wait for our acquire."""
    out = tmp_path / "j_RANK.json"
    _run(_worker("jit_off", out, "--group", lease_group), child_env, ranks=1)
    (result,) = _load(out, ranks=1)
    holds = _holds(result["timeline"])
    assert len(holds) == 8  # 4 steps x (compute, apply)
    stamps = np.asarray(result["stamps"], dtype=np.int64)
    assert len(stamps) == 8  # one regulariser and one schedule call per step
    outside = [s for s in stamps if not np.any((holds[:, 0] <= s) & (s <= holds[:, 1]))]
    assert not outside, (f"{len(outside)} ops ran outside the hold; first at "
                         f"{(outside[0] - holds[0, 0]) / 1e6:.1f} ms from the first acquire")


def test_xla_compiles_before_the_first_acquire(tmp_path, lease_group, child_env):
    out = tmp_path / "w_RANK.json"
    _run(_worker("warm_up", out, "--group", lease_group), child_env, ranks=1)
    (result,) = _load(out, ranks=1)
    for tag in (TAG_COMPUTE, TAG_APPLY):
        held_s = np.diff(_holds(result["timeline"], tag), axis=1)[:, 0] / 1e9
        assert len(held_s) == 8
        later = float(np.median(held_s[1:]))
        assert held_s[0] < 3 * later + 0.05, (
            f"tag {tag}: first hold {held_s[0]:.3f} s, later holds {later:.4f} s: XLA "
            "compiled under the lease")


def test_user_script_crossed_behaves_as_plain_horovod(tmp_path, lease_group, child_env):
    """Jobs a and b cross (two ranks each); the plain Horovod job runs the same script alone."""
    barrier = tmp_path / "barrier"
    jobs = {}
    for job, group in (("a", lease_group), ("b", lease_group), ("plain", "")):
        extra = ["--group", group, "--jobs", "2", "--barrier", f"{barrier}:4"] if group else []
        cmd = horovodrun_command(2, *_worker("user_script", tmp_path / f"{job}_RANK.json",
                                             "--ckpt", str(tmp_path / f"{job}.keras"), *extra))
        jobs[job] = subprocess.Popen(cmd, env=child_env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
    try:
        for job, proc in jobs.items():
            out, _ = proc.communicate(timeout=TIMEOUT_S)
            assert proc.returncode == 0, f"job {job}:\n{out[-6000:]}"
    finally:
        for proc in jobs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    crossed, other, plain = (_load(tmp_path / f"{job}_RANK.json") for job in jobs)

    for c, p in zip(crossed, plain):  # same seeds: crossing changes nothing
        np.testing.assert_allclose(c["losses"], p["losses"], rtol=1e-6, atol=1e-7)
        assert c["history"].keys() == p["history"].keys()
        for key in c["history"]:
            np.testing.assert_allclose(c["history"][key], p["history"][key], rtol=1e-6)
        np.testing.assert_allclose(c["predict"], p["predict"], rtol=1e-5, atol=1e-6)
        for name in ("evaluate", "reloaded_evaluate"):
            assert c[name].keys() == p[name].keys()
            np.testing.assert_allclose(list(c[name].values()), list(p[name].values()),
                                       rtol=1e-6)
    # evaluate returns the job's metrics on every rank (averaged over the ranks as fit's are),
    # though each rank evaluates its own shard with its own BatchNorm moving statistics.
    for name in ("evaluate", "reloaded_evaluate"):
        for job in (crossed, plain):
            assert job[0][name] == pytest.approx(job[1][name], rel=1e-12), name
    assert len(crossed[0]["history"]["val_loss"]) >= 2
    # Trainable weights agree across ranks; BatchNorm's moving statistics are per rank (README).
    _assert_same(crossed[0]["trainable"], crossed[1]["trainable"])
    assert _changed(crossed[0]["bn_moving_mean"], crossed[1]["bn_moving_mean"])
    # The checkpoint rank 0 wrote (last epoch) reloads to the trained model.
    np.testing.assert_allclose(crossed[0]["reloaded_predict"], crossed[0]["predict"],
                               rtol=1e-5, atol=1e-6)

    for rank in range(2):  # rank r of both jobs shares device cpu<r>
        mine, peer = crossed[rank], other[rank]
        a_holds, b_holds = _holds(mine["timeline"]), _holds(peer["timeline"])
        for start, end in a_holds:
            overlap = np.minimum(end, b_holds[:, 1]) - np.maximum(start, b_holds[:, 0])
            # Release is stamped under the lease's mutex, before the peer's acquire: exact.
            assert not np.any(overlap > 0), "both jobs held the device"
        eval_holds = _holds(mine["timeline"], TAG_OTHER)
        epochs = len(mine["history"]["val_loss"])
        # validation (2 steps per epoch), evaluate (2) and predict (1), for model and reloaded
        assert len(eval_holds) == 2 * epochs + 2 * (2 + 1)
        assert len(mine["test_batches"]) == 2 * epochs
        for begin, end in mine["test_batches"]:
            inside = (begin <= eval_holds[:, 0]) & (eval_holds[:, 1] <= end)
            assert inside.sum() == 1, "a validation step ran outside a hold of its own"
        assert not any(mine["held_at_epoch_end"])
        # Test and predict steps compiled before their first hold (XLA takes ~1 s here).
        held_s = np.diff(eval_holds, axis=1)[:, 0] / 1e9
        assert held_s.max() < EVAL_HOLD_MAX_S, held_s
