"""Mixed precision crossed (issue 63 item 6a): the crossover step scales the loss with the
optimizer's scale_loss and leaves unscaling, the finite check and the skip to the
LossScaleOptimizer's apply_gradients. A crossed pair under mixed_float16, whose loss scale
starts so high that its first steps overflow and are skipped, must end every rank with the
weights, loss scale and step count of the same job trained plainly (no group), bit for bit.

Against plain Keras in one process on the global batch it differs by design of the step, and
this test pins by how much: each rank's loss is the mean over its own rows, averaged over the
ranks after the backward pass, so its scaled float16 gradients are `ranks` times one process's
and overflow at a scale `ranks` times smaller. The dynamic scale therefore settles
log2(ranks) halvings lower, after as many more skipped first steps (here 1 of 2 ranks), and
from then on holds the same float16 magnitudes. A step that divided each rank's loss by the
global batch and summed the gradients (as tf.distribute does) would match Keras's skips; that
change belongs to crossover_tf/_keras/train_step.py and would fail this pin on purpose."""
from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest

from conftest import BACKENDS, WORKERS, launch_command, run_bounded, run_worker_pair

WORKER = str(WORKERS / "strategy_worker.py")
STEPS = 24
INITIAL_SCALE = 2.0 ** 24  # strategy_worker.MIXED_INITIAL_SCALE


def _load(out: pathlib.Path, job: str) -> list[dict]:
    return [json.loads((out / f"{job}_{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_crossed_mixed_precision_fit_trains_like_a_plain_one(tmp_path, lease_group,
                                                               child_env, backend):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    common = ["--steps", str(STEPS), "--backend", backend, "--fit_only", "--mixed_precision"]
    run_worker_pair(WORKER, tmp_path, backend, ["--group", lease_group, "--jobs", "2",
                                                "--barrier", f"{barrier}:4", *common],
                    child_env, timeout=300)
    plain = run_bounded(launch_command(backend, 2, sys.executable, WORKER,
                                       str(tmp_path / "plain_RANK.json"), *common),
                        child_env, timeout=240)
    assert plain.returncode == 0, plain.stdout[-6000:]

    keras_alone = run_bounded([sys.executable, WORKER, str(tmp_path / "ref_RANK.json"),
                               "--reference", *common], child_env, timeout=240)
    assert keras_alone.returncode == 0, keras_alone.stdout[-6000:]

    plain_ranks = _load(tmp_path, "plain")
    reference = plain_ranks[0]
    skipped = STEPS - reference["iterations"]
    assert 0 < skipped < STEPS and reference["loss_scale"] == INITIAL_SCALE / 2 ** skipped
    assert np.all(np.isfinite(reference["losses"]))
    alone = json.loads((tmp_path / "ref_0.json").read_text())
    assert (alone["iterations"], alone["loss_scale"]) == (
        reference["iterations"] + 1, 2 * reference["loss_scale"])  # the module's pin
    for job in ("a", "b", "plain"):
        for rank in _load(tmp_path, job):
            assert (rank["iterations"], rank["loss_scale"]) == (
                reference["iterations"], reference["loss_scale"]), (job, rank["rank"])
            assert rank["losses"] == plain_ranks[rank["rank"]]["losses"], (job, rank["rank"])
            for w_rank, w_plain in zip(rank["weights"], reference["weights"]):
                np.testing.assert_array_equal(w_rank, w_plain, err_msg=f"{job} {rank['rank']}")
            if job != "plain":
                assert rank["lease_stats"]["acquires"] == 2 * STEPS, rank["lease_stats"]
