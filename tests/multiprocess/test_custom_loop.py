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
    (no Keras step joins them: the tape does, on its first allreduce). Its gradients go in
    several buckets (issue 60: the allreduce overlaps the backward pass) and the sums are the
    plain loop's one grouped allreduce's."""
    barrier = tmp_path / "barrier"
    crossed = ["--group", lease_group, "--jobs", "2", "--steps", str(STEPS), "--barrier",
               f"{barrier}:4", "--backend", backend, "--bucket_bytes", "1024"]
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
    for rank in (*a, *b):
        # Each bucket its own collective (TensorFlow: 3 buckets of >= 1 KiB; Horovod: each of
        # the 6 gradients alone, which its fusion buffer buckets as they come), free to start
        # before the mid-step yield, which never waits for one: the device is not held for the
        # network. With link turns they wait for the yield: the turn's wait, a blocking kernel,
        # must not block while the device is held.
        assert rank["overlap"] == {"collectives": 6 if backend == "horovod" else 3,
                                   "yield_waits_for_collective": False,
                                   "collective_waits_for_yield": link_turns}, rank["overlap"]

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


NESTED_PROBE = """
import sys, warnings
import keras, numpy as np, tensorflow as tf
import crossover_tf
strategy = crossover_tf.CrossoverStrategy(
    sys.argv[1], lease=crossover_tf.LeaseOptions(jobs=1),
    communication=crossover_tf.CommunicationOptions(backend="tensorflow"))
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
y = (x[:, 0] > 0).astype("int32")


def trained(in_run):
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        optimizer = keras.optimizers.SGD(0.1)

    def step(x, y):  # the step of the 2026-12-04 docs
        with strategy.hold_device():
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = strategy.gradient_tape(tape).gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    traced = tf.function(lambda x, y: strategy.run(step, args=(x, y)) if in_run else step(x, y))
    before = strategy.lease_stats()["acquires"]
    losses = [float(traced(x, y)) for _ in range(3)]
    return losses, model.get_weights(), int(strategy.lease_stats()["acquires"] - before)


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", DeprecationWarning)
    plain, nested = trained(False), trained(True)
print("equal", plain[0] == nested[0] and all((a == b).all() for a, b in zip(plain[1], nested[1])))
print("holds", plain[2], nested[2])
for warning in caught:
    if issubclass(warning.category, DeprecationWarning) and "crossover_tf" in str(warning.message):
        print("deprecated:", warning.message)
strategy.leave_device()
"""


@pytest.mark.multiprocess
def test_a_hold_and_tape_inside_run_are_deprecated_no_ops_in_a_lone_job(lease_group,
                                                                        child_env):
    """Issue 60: a loop ported to the 2026-12-04 docs (strategy.hold_device() and
    strategy.gradient_tape(tape) inside strategy.run) failed at trace ("already open in this
    step", "reduced twice"). Now the nested hold holds nothing more than run's and its body runs
    as outside run: the same losses and weights, bit for bit, and as many holds, with one
    DeprecationWarning a trace naming the replacement."""
    result = run_bounded([sys.executable, "-c", NESTED_PROBE, lease_group], child_env, 180)
    _ok(result)
    assert "equal True" in result.stdout, result.stdout[-3000:]
    assert "holds 6 6" in result.stdout, result.stdout[-3000:]
    warned = [line for line in result.stdout.splitlines() if line.startswith("deprecated:")]
    assert len(warned) == 1, result.stdout[-3000:]
    for part in ("strategy.hold_device() inside strategy.run", "deprecated",
                 "drop strategy.run"):
        assert part in warned[0], (part, warned[0])


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_hold_and_tape_inside_run_train_two_ranks_as_the_unnested_loop(tmp_path, lease_group,
                                                                         child_env):
    """With 2 ranks, where run's replica context would make a Keras loss divide by the global
    batch and the optimizer sum the gradients: the loop of the 2026-12-04 docs inside
    strategy.run ends with the un-nested loop's losses and weights, bit for bit, on each rank,
    two holds a step, warned once."""
    common = ["--group", lease_group, "--steps", "6", "--backend", "tensorflow"]
    for prefix, flags in (("outside", []), ("nested", ["--in_run"])):
        _ok(run_bounded(launch_command("tensorflow", 2, sys.executable, WORKER,
                                       str(tmp_path / f"{prefix}_RANK.json"), *common, *flags),
                        child_env, 240))
    outside, nested = _load(tmp_path, "outside"), _load(tmp_path, "nested")
    for rank in range(2):
        assert nested[rank]["losses"] == outside[rank]["losses"], rank
        for w_nested, w_outside in zip(nested[rank]["weights"], outside[rank]["weights"]):
            np.testing.assert_array_equal(w_nested, w_outside)
        assert nested[rank]["lease_stats"]["acquires"] == 2 * 6, nested[rank]["lease_stats"]
        assert outside[rank]["deprecations"] == [] and len(nested[rank]["deprecations"]) == 1
    assert outside[0]["losses"][-1] < outside[0]["losses"][0]
