"""Crossover jobs with a link turn, run as their own processes by
tests/multiprocess/test_turn_lifecycle.py.

Modes (argv[1]):
  train OUT --group G --link_turn P [--steps N] [--epochs E] [--barrier DIR:COUNT]
        [--rank0_epoch_end_sleep S] [--until FILE] [--done FILE]
      one rank of a job under horovodrun: fit, then write this rank's turn timeline to OUT
      (RANK replaced by the rank). --rank0_epoch_end_sleep makes rank 0 alone slow at the
      first epoch's end (as a checkpoint saved on rank 0 is); --until stops the fit once FILE
      exists (checked by every rank on the same steps, so they stop together); --done touches
      FILE when the fit is over.
  lifecycle OUT --group G --scenario {refit,errors}
      one rank at position 0 of 2 that stops stepping in a way a fit should tidy up after;
      meanwhile a peer (the `peer` mode, another process) takes turns at position 1, and the
      result says whether this job was still joined and how long the peer waited for it.
  peer GROUP KEY TURNS WAIT_S
      joins at position 1 of 2, takes TURNS turns and prints its turn statistics (JSON).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

BATCH, FEATURES, CLASSES = 16, 16, 4
PEER_TURNS, PEER_WAIT_S = 3, 1.0
CHECK_EVERY = 20  # --until: steps between the ranks' agreed checks


def build_model() -> keras.Model:
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(32, activation="tanh"),
                              keras.layers.Dense(CLASSES)])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)  # nothing here needs XLA; it only slows the start
    return model


def data(steps: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.normal(size=(BATCH * steps, FEATURES)).astype("float32"),
            rng.integers(0, CLASSES, size=(BATCH * steps,)))


# ----- train: one rank of a job under horovodrun --------------------------------------------
class StopWhenFileExists(keras.callbacks.Callback):
    """Stops the fit once a file exists; the ranks agree (a sum over ranks) on the same steps,
    so none of them is left waiting in an allreduce for a rank that stopped."""

    def __init__(self, path: str):
        super().__init__()
        self.path = pathlib.Path(path)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if batch % CHECK_EVERY:
            return
        import horovod.tensorflow as hvd
        import tensorflow as tf
        seen = hvd.allreduce(tf.constant(float(self.path.exists())), op=hvd.Sum,
                             name="turn_worker_until")
        if float(seen) > 0:
            self.model.stop_training = True


def train(args: argparse.Namespace) -> None:
    import crossover_tf
    from experiments.barrier import wait_at_barrier
    # A long wait bound: a full garbage collection under load pauses a rank for seconds, and
    # a turn skipped meanwhile would let the other job run ahead, which is not what is tested.
    strategy = crossover_tf.CrossoverStrategy(
        args.group, lease=crossover_tf.LeaseOptions(jobs=args.jobs, timeout_s=120),
        link_turn=crossover_tf.LinkTurnOptions(position=args.link_turn, wait_s=60))
    rank = strategy.rank
    with strategy.scope():
        model = build_model()
    callbacks = [*strategy.callbacks()]
    if args.barrier:  # line the jobs up before training: start-up takes seconds
        callbacks.append(keras.callbacks.LambdaCallback(on_train_begin=lambda logs: wait_at_barrier(
            args.barrier, f"{args.link_turn}-{rank}-{os.getpid()}")))
    if args.rank0_epoch_end_sleep and rank == 0:
        callbacks.append(keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: (
            time.sleep(args.rank0_epoch_end_sleep) if epoch == 0 else None)))
    if args.until:
        callbacks.append(StopWhenFileExists(args.until))
    x, y = data(args.steps)
    model.fit(x, y, batch_size=BATCH, epochs=args.epochs, shuffle=False, verbose=0,
              callbacks=callbacks)
    if args.done and rank == 0:
        pathlib.Path(args.done).touch()
    result = {"rank": rank, "link_turn_stats": strategy.link_turn_stats(),
              "turn_timeline": strategy.link_turn_timeline().tolist()}
    pathlib.Path(args.out.replace("RANK", str(rank))).write_text(json.dumps(result))


# ----- lifecycle: one rank, and a peer in another process ------------------------------------
def run_peer(group: str, key: str) -> dict:
    """The peer's turn statistics: it waits only if this job is still in the turn table."""
    done = subprocess.run([sys.executable, __file__, "peer", group, key, str(PEER_TURNS),
                           str(PEER_WAIT_S)], capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        raise RuntimeError(f"peer failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


class AtFirstBatch(keras.callbacks.Callback):
    """Runs a function where a fit's very first step is about to begin."""

    def __init__(self, function):
        super().__init__()
        self.function = function
        self.first = True

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self.first:
            self.first = False
            self.function()


def refit(strategy, model, x, y, result: dict) -> None:
    """Two fits. Where the second one's first step begins (before its broadcast and, with XLA,
    its compile), the job must not have joined yet: a peer taking turns then waits for none."""
    joined: list[bool] = []

    def at_first_batch() -> None:
        joined.append(strategy.in_link_turn_order)
        if len(joined) == 2:   # the second fit: stands in for its slow first step
            result["peer"] = run_peer(strategy.group, strategy.device_key)

    for _ in range(2):
        model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0,
                  callbacks=[*strategy.callbacks(), AtFirstBatch(at_first_batch)])
    result["joined_at_first_batch"] = joined


def errors(strategy, model, x, y, result: dict) -> None:
    """A callback raises between steps (an error, then Ctrl-C): afterwards, with this process
    still alive (a notebook's kernel), the job is out of the turn table."""
    joined = []
    for error in (RuntimeError("a callback failed"), KeyboardInterrupt()):
        def fail(batch: int, logs: dict | None, error: BaseException = error) -> None:
            if batch == 3:
                raise error
        try:
            model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[
                *strategy.callbacks(), keras.callbacks.LambdaCallback(on_train_batch_end=fail)])
        except (RuntimeError, KeyboardInterrupt) as e:
            joined.append([type(e).__name__, strategy.in_link_turn_order])
    result["joined_after_error"] = joined
    result["peer"] = run_peer(strategy.group, strategy.device_key)


def lifecycle(args: argparse.Namespace) -> None:
    import crossover_tf
    strategy = crossover_tf.CrossoverStrategy(
        args.group, lease=crossover_tf.LeaseOptions(jobs=args.jobs),
        link_turn=crossover_tf.LinkTurnOptions(position=0))
    with strategy.scope():
        model = build_model()
    x, y = data(8)
    result: dict = {}
    {"refit": refit, "errors": errors}[args.scenario](strategy, model, x, y, result)
    pathlib.Path(args.out).write_text(json.dumps(result))


def peer(group: str, key: str, turns: int, wait_s: float) -> None:
    import tensorflow as tf
    from crossover_tf.lease import DeviceLease, LinkTurn
    turn = LinkTurn(DeviceLease(group, key), 1, 2, lambda n: n, wait_s)
    turn.join()
    for _ in range(turns):
        turn.done(turn.wait(tf.constant(0.0)))
    turn.leave()
    print(json.dumps(turn.stats().as_dict()))


def main() -> None:
    if sys.argv[1] == "peer":
        peer(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["train", "lifecycle"])
    parser.add_argument("out")
    parser.add_argument("--group", required=True)
    parser.add_argument("--jobs", type=int, default=1, help="jobs in the crossover group")
    parser.add_argument("--link_turn", type=int, default=0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--barrier", default="")
    parser.add_argument("--rank0_epoch_end_sleep", type=float, default=0.0)
    parser.add_argument("--until", default="")
    parser.add_argument("--done", default="")
    parser.add_argument("--scenario", choices=["refit", "errors"], default="refit")
    args = parser.parse_args()
    (train if args.mode == "train" else lifecycle)(args)


if __name__ == "__main__":
    main()
