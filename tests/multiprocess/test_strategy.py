"""CrossoverStrategy end to end: real Horovod processes (horovodrun --gloo on localhost)."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from conftest import (BACKENDS, ERROR_LINE, WORKERS, horovodrun_command, launch_command,
                      run_alongside, run_bounded, run_worker_pair)
from crossover_tf.profiling import phases as timeline
from step_crossings import overlap_steps

WORKER = str(WORKERS / "strategy_worker.py")
STEPS = 30


def _load(tmp_path: pathlib.Path, prefix: str, ranks: int) -> list[dict]:
    return [json.loads((tmp_path / f"{prefix}_{r}.json").read_text()) for r in range(ranks)]


def _check(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-6000:]


def assert_trains_like_reference(ranks: list[dict], reference: dict) -> None:
    """A job's ranks end with identical weights, and train like one process on the global
    batch: Keras logs each rank's running mean loss, whose average is the global one."""
    mean_loss = np.mean([r["losses"] for r in ranks], axis=0)
    np.testing.assert_allclose(mean_loss, reference["losses"], rtol=1e-4, atol=1e-6)
    for w_rank0, w_rank1, w_ref in zip(ranks[0]["weights"], ranks[1]["weights"],
                                       reference["weights"]):
        np.testing.assert_array_equal(w_rank0, w_rank1)
        np.testing.assert_allclose(w_rank0, w_ref, rtol=1e-4, atol=1e-5)


def _plain_job(tmp_path: pathlib.Path, name: str, backend: str,
               child_env: dict[str, str]) -> list[dict]:
    """A job of 2 ranks fit plainly (no group, callbacks), STEPS steps: each rank's record."""
    _check(run_bounded(launch_command(
        backend, 2, sys.executable, WORKER, str(tmp_path / f"{name}_RANK.json"), "--steps",
        str(STEPS), "--backend", backend, "--fit_only"), child_env, 240))
    return _load(tmp_path, name, 2)


def assert_leased_like(ranks: list[dict], plain: list[dict]) -> None:
    """Every rank of a leased job took the lease twice a step and ends with rank 0's weights,
    those of the same job trained plainly (`plain`, rank by rank)."""
    for rank, reference in zip(ranks, plain):
        assert rank["lease_stats"]["acquires"] == 2 * STEPS, rank["lease_stats"]
        for w_rank, w_rank0, w_plain in zip(rank["weights"], ranks[0]["weights"],
                                            reference["weights"]):
            np.testing.assert_array_equal(w_rank, w_rank0)
            np.testing.assert_allclose(w_rank, w_plain, rtol=1e-6, atol=1e-7)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_crossed_pair_trains_like_solo_and_single_process(tmp_path, lease_group, child_env,
                                                          backend):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    crossed_args = ["--steps", str(STEPS), "--barrier", f"{barrier}:4",  # 2 jobs x 2 ranks
                    "--jobs", "2", "--backend", backend]
    common = ["--steps", str(STEPS), "--backend", backend]
    for result in run_alongside(
            launch_command(backend, 2, sys.executable, WORKER, str(tmp_path / "a_RANK.json"),
                           "--group", lease_group, "--save", str(tmp_path), *crossed_args),
            launch_command(backend, 2, sys.executable, WORKER, str(tmp_path / "b_RANK.json"),
                           "--group", lease_group, *crossed_args), child_env, timeout=240):
        _check(result)
    _check(run_bounded(launch_command(
        backend, 2, sys.executable, WORKER, str(tmp_path / "solo_RANK.json"), *common),
        child_env, 240))
    _check(run_bounded([sys.executable, WORKER, str(tmp_path / "ref_RANK.json"), "--reference",
                        *common], child_env, 240))

    crossed_a, crossed_b = _load(tmp_path, "a", 2), _load(tmp_path, "b", 2)
    solo, (reference,) = _load(tmp_path, "solo", 2), _load(tmp_path, "ref", 1)
    for crossed, plain in zip(crossed_a, solo):
        assert len(crossed["losses"]) == STEPS
        np.testing.assert_allclose(crossed["losses"], plain["losses"], rtol=1e-6, atol=1e-7)
        for w_crossed, w_plain in zip(crossed["weights"], plain["weights"]):
            np.testing.assert_allclose(w_crossed, w_plain, rtol=1e-6, atol=1e-7)
    assert_trains_like_reference(crossed_a, reference)
    assert reference["losses"][-1] < reference["losses"][0]

    for rank in range(2):
        a_stats, b_stats = crossed_a[rank]["lease_stats"], crossed_b[rank]["lease_stats"]
        assert a_stats["acquires"] == 2 * STEPS and b_stats["acquires"] == 2 * STEPS
        assert a_stats["handoffs"] + b_stats["handoffs"] > 0, (a_stats, b_stats)
        assert not a_stats["held"] and not b_stats["held"]
    overlaps = 0
    for rank in range(2):   # rank r of A and rank r of B share device cpu<r>
        a_steps = timeline.step_phases(crossed_a[rank]["timeline"])
        b_steps = timeline.step_phases(crossed_b[rank]["timeline"])
        assert len(a_steps) == len(b_steps) == STEPS
        overlaps += overlap_steps(a_steps, b_steps) + overlap_steps(b_steps, a_steps)
    print(f"steps computed during the peer's allreduce: {overlaps} of {4 * STEPS}")
    assert overlaps >= 3, f"only {overlaps} steps computed during the peer's allreduce"

    # evaluate/predict work after crossed training; only rank 0 saved the model.
    for r in crossed_a:
        assert np.isfinite(r["evaluate"]["loss"]) and r["predict_shape"] == [3, 4]
    assert sorted(p.name for p in tmp_path.glob("*.keras")) == ["model.keras"]
    import keras
    restored = keras.models.load_model(tmp_path / "model.keras")
    for w_saved, w_trained in zip(restored.get_weights(), crossed_a[0]["weights"]):
        np.testing.assert_allclose(w_saved, w_trained)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_crossed_jobs_with_no_backend_option_under_the_launcher_use_tensorflows_collectives(
        tmp_path, lease_group, child_env):
    """Issue 51: with no backend option, jobs that `python -m crossover_tf.launch` starts cross
    through TensorFlow's collectives (backend "auto"; Horovod only under horovodrun), each job
    one world of two ranks, and end without error lines."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    crossed = ["--group", lease_group, "--steps", str(STEPS), "--barrier", f"{barrier}:4",
               "--jobs", "2", "--backend", "default", "--fit_only"]
    for result in run_alongside(
            launch_command("tensorflow", 2, sys.executable, WORKER,
                           str(tmp_path / "a_RANK.json"), *crossed),
            launch_command("tensorflow", 2, sys.executable, WORKER,
                           str(tmp_path / "b_RANK.json"), *crossed), child_env, timeout=240):
        _check(result)
        assert not ERROR_LINE.findall(result.stdout), result.stdout[-4000:]
    a, b = _load(tmp_path, "a", 2), _load(tmp_path, "b", 2)
    for rank_a, rank_b in zip(a, b):
        for rank in (rank_a, rank_b):
            assert (rank["size"], rank["communicator"]) == (2, "TensorFlowCommunicator"), rank
            assert rank["lease_stats"]["acquires"] == 2 * STEPS, rank["lease_stats"]
        # One job's ranks agree; the two jobs train the same model on the same data.
        for w_a, w_a0, w_b in zip(rank_a["weights"], a[0]["weights"], rank_b["weights"]):
            np.testing.assert_array_equal(w_a, w_a0)
            np.testing.assert_allclose(w_a, w_b, rtol=1e-6, atol=1e-7)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_script_with_no_backend_option_started_alone_is_one_rank(tmp_path, child_env):
    """Issue 51: no launcher (no TF_CONFIG, no horovodrun, no Slurm step) and no backend
    option: one rank of TensorFlow's collectives, no Horovod needed."""
    env = {k: v for k, v in child_env.items() if k != "TF_CONFIG"
           and not k.startswith(("HOROVOD_", "OMPI_", "PMI_", "SLURM_"))}
    _check(run_bounded([sys.executable, WORKER, str(tmp_path / "one_RANK.json"), "--steps", "4",
                        "--backend", "default", "--fit_only"], env, 180))
    (one,) = _load(tmp_path, "one", 1)
    assert (one["size"], one["communicator"]) == (1, "TensorFlowCommunicator"), one
    assert len(one["losses"]) == 4 and all(np.isfinite(one["losses"]))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_fit_on_a_model_made_in_scope_crosses_without_callbacks(tmp_path, lease_group,
                                                                child_env):
    """Issue 49: a MultiWorkerMirroredStrategy port swaps only the strategy line, so its fit
    passes no strategy.callbacks(). Before, every rank then trained alone (different weights
    per rank, no lease taken). Now a model made under scope() crosses and synchronises by
    itself: a crossed pair without callbacks ends with the weights of a plain job with them,
    identical on both ranks, every step under the lease."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    backend = "tensorflow"
    crossed = ["--steps", str(STEPS), "--barrier", f"{barrier}:4", "--jobs", "2", "--backend",
               backend, "--no_callbacks", "--fit_only"]
    run_worker_pair(WORKER, tmp_path, backend, ["--group", lease_group, *crossed], child_env)
    solo = _plain_job(tmp_path, "solo", backend, child_env)
    for job in ("a", "b"):
        assert_leased_like(_load(tmp_path, job, 2), solo)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_fit_on_a_model_made_outside_scope_is_refused(tmp_path, child_env):
    """A model made outside every scope would train each rank alone: every rank's fit is
    refused at once, naming both fixes, instead of training apart."""
    result = run_bounded(launch_command(
        "tensorflow", 2, sys.executable, WORKER, str(tmp_path / "out_RANK.json"), "--steps",
        "4", "--backend", "tensorflow", "--no_callbacks", "--outside_scope", "--fit_only"),
        child_env, 240)
    assert result.returncode != 0, result.stdout[-3000:]
    for part in ("this model was not made under strategy.scope()", "would run on this rank "
                 "alone", "with strategy.scope():", "callbacks=strategy.callbacks()"):
        assert part in result.stdout, (part, result.stdout[-3000:])
    assert not list(tmp_path.glob("out_*.json"))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_train_on_batch_on_a_model_made_in_scope_takes_the_lease_and_synchronises(
        tmp_path, lease_group, child_env):
    """Keras's train_on_batch skips fit, so a model made under scope() used to train each rank
    alone and beside the peer job with no lease, silently. Now its first call installs the
    crossover step: a job of 2 ranks stepping by train_on_batch takes the lease twice a step and
    ends with the weights of the same job fit with strategy.callbacks(), identical on both
    ranks."""
    backend = "tensorflow"
    common = ["--steps", str(STEPS), "--backend", backend, "--fit_only"]
    _check(run_bounded(launch_command(
        backend, 2, sys.executable, WORKER, str(tmp_path / "tob_RANK.json"), "--group",
        lease_group, "--jobs", "1", "--train_on_batch", *common), child_env, 240))
    assert_leased_like(_load(tmp_path, "tob", 2), _plain_job(tmp_path, "fit", backend, child_env))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_train_on_batch_crosses_with_link_turns_like_a_plain_fit(tmp_path, lease_group,
                                                                 child_env):
    """Two jobs of 2 ranks stepping by train_on_batch, crossing with link turns: each takes
    its turn every step without joining again (train_on_batch prepares every call) and ends
    with the weights of the same job fit plainly, identical on both ranks."""
    backend = "tensorflow"
    crossed = ["--steps", str(STEPS), "--backend", backend, "--fit_only", "--jobs", "2",
               "--train_on_batch", "--group", lease_group]
    run_worker_pair(WORKER, tmp_path, backend, crossed, child_env, a=("--link_turn", "0"),
                    b=("--link_turn", "1"), timeout=300)
    plain = _plain_job(tmp_path, "fit", backend, child_env)
    for job in ("a", "b"):
        ranks = _load(tmp_path, job, 2)
        assert_leased_like(ranks, plain)
        for rank in ranks:
            turns = rank["link_turn_stats"]
            assert turns["turns"] == STEPS and turns["skipped"] == 0, turns


ONE_BATCH_PROBE = """
import sys
import keras, numpy as np
import crossover_tf
strategy = crossover_tf.CrossoverStrategy(sys.argv[1], lease=crossover_tf.LeaseOptions(jobs=1))
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
x, y = np.ones((8, 4), "float32"), np.ones((8, 2), "float32")
acquires = [strategy.lease_stats()["acquires"]]
for step in (lambda: model.train_on_batch(x, y), lambda: model.test_on_batch(x, y),
             lambda: model.predict_on_batch(x)):
    step()
    acquires.append(strategy.lease_stats()["acquires"])
print("acquires", np.diff(acquires).astype(int).tolist())
outside = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
outside.compile("sgd", "mse")
try:
    outside.train_on_batch(x, y)
except ValueError as err:
    print("refused:", err)
strategy.leave_device()
"""


@pytest.mark.multiprocess
def test_one_batch_steps_take_the_lease_and_a_model_made_outside_is_refused(lease_group,
                                                                           child_env):
    """In a lone crossover job (a process of its own: a strategy made here would outlive the
    test and refuse later tests' models), train_on_batch (two holds: compute and apply),
    test_on_batch and predict_on_batch (one hold each) on a model made in scope take the
    device lease, and train_on_batch on a model made outside every scope, which would compute
    beside the peer without the lease, is refused, as fit is, naming the fix."""
    result = run_bounded([sys.executable, "-c", ONE_BATCH_PROBE, lease_group], child_env, 180)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "acquires [2, 1, 1]" in result.stdout, result.stdout[-3000:]
    assert "refused: crossover_tf: this model was not made under strategy.scope(), so its " \
        "train_on_batch would run on this rank alone" in result.stdout, result.stdout[-3000:]


LOADED_MODEL_PROBE = """
import sys
import keras, numpy as np
import crossover_tf
strategy = crossover_tf.CrossoverStrategy(
    sys.argv[1], lease=crossover_tf.LeaseOptions(jobs=1),
    communication=crossover_tf.CommunicationOptions(backend="tensorflow",
                                                    collective_timeout_s=60))
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
if strategy.should_checkpoint:  # rank 0 alone, as a script reloads its checkpoint
    model.save(sys.argv[2] + "/model.keras")
    loaded = keras.models.load_model(sys.argv[2] + "/model.keras")  # outside every scope
    x, y = np.arange(32, dtype="float32").reshape(8, 4) / 32, np.ones((8, 2), "float32")
    kernel, bias = loaded.get_weights()
    acquires = [strategy.lease_stats()["acquires"]]
    predicted = loaded.predict(x, batch_size=4, verbose=0)
    acquires.append(strategy.lease_stats()["acquires"])
    loss = loaded.evaluate(x, y, batch_size=4, verbose=0)
    acquires.append(strategy.lease_stats()["acquires"])
    np.testing.assert_allclose(predicted, x @ kernel + bias, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loss, np.mean((x @ kernel + bias - y) ** 2), rtol=1e-5)
    print("holds", np.diff(acquires).astype(int).tolist())
strategy.leave_device()
"""


@pytest.mark.multiprocess
@pytest.mark.slow
def test_predict_and_evaluate_of_a_loaded_model_run_on_the_calling_rank_with_the_lease(
        tmp_path, lease_group, child_env):
    """Issue 60: a script that reloads its checkpoint with keras.models.load_model and predicts
    on rank 0 alone was refused ("would run on this rank alone: ... trains apart"), where
    MultiWorkerMirroredStrategy runs a model made outside its scope on the calling worker. Now
    a loaded model's predict and evaluate run on the calling rank alone (no collective: rank 1
    never calls them), each batch under the device lease, with Keras's own results."""
    result = run_bounded(launch_command("tensorflow", 2, sys.executable, "-c",
                                        LOADED_MODEL_PROBE, lease_group, str(tmp_path)),
                         child_env, 240)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "holds [2, 2]" in result.stdout, result.stdout[-4000:]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_xla_compiles_compute_and_apply_but_not_collectives(tmp_path, lease_group, child_env):
    """XLA's own dump lists what it compiled: the compute and apply functions, never the outer
    step that holds Horovod's allreduce and the lease ops. Also the no-peer path."""
    dump = tmp_path / "xla_dump"
    env = {**child_env, "XLA_FLAGS": f"--xla_dump_to={dump}"}
    _check(run_bounded([sys.executable, WORKER, str(tmp_path / "x_RANK.json"), "--group",
                        lease_group, "--steps", "5", "--fit_only"], env, timeout=180))
    modules = {p.name.split(".")[1] for p in dump.glob("*before_optimizations.txt")}
    assert any("crossover_compute_gradients" in m for m in modules), modules
    assert any("crossover_apply_gradients" in m for m in modules), modules
    assert not any("one_step_on_data" in m or "multi_step" in m for m in modules), modules
    (result,) = _load(tmp_path, "x", 1)
    assert result["jit_compile"] is True
    stats = result["lease_stats"]   # alone on the device: never waits behind anyone
    assert stats["acquires"] == 10 and stats["handoffs"] == 0 and stats["contended"] == 0


@pytest.mark.multiprocess
@pytest.mark.slow
def test_model_xla_cannot_compile_fails_clearly(tmp_path, lease_group, child_env):
    result = run_bounded([sys.executable, WORKER, str(tmp_path / "bad_RANK.json"), "--group",
                          lease_group, "--steps", "3", "--bad_xla"], child_env, timeout=180)
    assert result.returncode != 0
    assert "XLA could not compile the model's training computation" in result.stdout


@pytest.mark.multiprocess
@pytest.mark.slow
def test_mismatched_groups_between_ranks_fail_clearly(tmp_path, lease_group, child_env):
    result = run_bounded(horovodrun_command(
        2, sys.executable, WORKER, str(tmp_path / "m_RANK.json"), "--group", lease_group,
        "--group_per_rank"), child_env, timeout=180)
    assert result.returncode != 0
    assert "ranks of one job must use the same crossover group" in result.stdout


def test_uninitialised_horovod_is_a_clear_error():
    import horovod.tensorflow as hvd
    import crossover_tf
    if hvd.is_initialized():
        hvd.shutdown()
    with pytest.raises(RuntimeError, match="Horovod is not initialised"):
        crossover_tf.CrossoverStrategy(
            "g", communication=crossover_tf.CommunicationOptions(backend="horovod",
                                                                 init_horovod=False))


def test_extended_knows_the_variables_made_in_scope():
    """tf.distribute's extended.variable_created_in_scope (issue 49: it was missing), for
    tf.Variables too (issue 60: False for one made in scope), and extended.should_checkpoint
    and should_save_summary, where tf.distribute code looks (issue 60: AttributeError)."""
    import keras
    import tensorflow as tf
    import crossover_tf
    strategy = crossover_tf.CrossoverStrategy(
        "", communication=crossover_tf.CommunicationOptions(backend="tensorflow"))
    with strategy.scope():
        inside = keras.Variable(1.0)
        tf_inside = tf.Variable(1.0)
    outside = keras.Variable(2.0)
    tf_outside = tf.Variable(2.0)
    assert strategy.extended.variable_created_in_scope(inside)
    assert not strategy.extended.variable_created_in_scope(outside)
    assert strategy.extended.variable_created_in_scope(tf_inside)
    assert not strategy.extended.variable_created_in_scope(tf_outside)
    assert strategy.extended.should_checkpoint is True
    assert strategy.extended.should_save_summary is True


def test_single_process_surface():
    """size-1 strategy: tf.distribute-style methods behave like OneDeviceStrategy."""
    import tensorflow as tf
    import crossover_tf
    strategy = crossover_tf.CrossoverStrategy(group="")
    assert strategy.num_replicas_in_sync == 1 and strategy.rank == 0
    assert strategy.should_save_summary and strategy.should_checkpoint
    assert not strategy.is_crossover and strategy.lease_stats() == {}
    assert float(strategy.reduce("sum", tf.constant([1.0, 2.0]), axis=0)) == 3.0
    assert float(strategy.reduce(tf.distribute.ReduceOp.MEAN, tf.constant([1.0, 3.0]),
                                 axis=0)) == 2.0
    assert strategy.run(lambda a, b: a + b, args=(2, 3)) == 5
    with pytest.raises(ValueError, match="unsupported reduce op"):
        strategy.reduce("max", tf.constant(1.0))
    ds = tf.data.Dataset.range(8).batch(4)
    assert [b.numpy().tolist() for b in strategy.distribute_dataset(ds)] == [[0, 1, 2, 3],
                                                                            [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="group 'a b' is invalid"):
        crossover_tf.CrossoverStrategy(group="a b")


def test_step_statistics_marks_the_job_and_its_priority_in_tensorboard(tmp_path):
    """N jobs side by side in TensorBoard: each run says which job it is and its priority."""
    import types

    import tensorflow as tf

    from experiments.step_statistics import StepStatistics
    strategy = types.SimpleNamespace(should_save_summary=True, lease_stats=lambda: {})
    stats = StepStatistics(strategy, 8, str(tmp_path),
                           description={"job": "B", "priority": "secondary"})
    stats.on_train_begin()
    stats.on_train_batch_begin(0)
    stats.on_train_batch_end(0, {"loss": 1.0})
    stats.on_train_end()
    texts = {}
    for path in tmp_path.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == "job":
                    texts[value.tag] = tf.make_ndarray(value.tensor).item().decode()
    assert "| priority | secondary |" in texts["job"] and "| job | B |" in texts["job"]
