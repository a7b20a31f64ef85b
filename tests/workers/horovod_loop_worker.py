"""A custom loop in Horovod's TensorFlow 2 idiom (its examples' shape: hvd.init, the
DistributedGradientTape, hvd.broadcast_variables inside the step on the first batch), run as
written (--original) or ported to the strategy as docs/coming_from_horovod.md shows; writes
each rank's losses and final weights as JSON.

Run under `horovodrun --gloo -np 2` by tests/multiprocess/test_horovod_port.py. Plain
tf.Variables: Horovod's own tape and broadcast do not take Keras 3 variables (horovod#4290).
Each rank starts from weights of its own (seeded by rank), as a Horovod script does before its
first-batch broadcast, and trains on its own rows.

  horovod_loop_worker.py OUT (--original | --port) [--steps N]
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from worker_output import write_rank_result  # noqa: E402

FEATURES, HIDDEN, CLASSES, BATCH, LR = 32, 16, 10, 32, 0.1


def variables(rank: int) -> list[tf.Variable]:
    """A two-layer model's weights, different on every rank until the first broadcast."""
    shapes = [(FEATURES, HIDDEN), (HIDDEN,), (HIDDEN, CLASSES), (CLASSES,)]
    return [tf.Variable(tf.random.stateless_normal(shape, seed=[rank, i]) * 0.1)
            for i, shape in enumerate(shapes)]


def loss_of(weights: list[tf.Variable], x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    w1, b1, w2, b2 = weights
    logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))


def batches(rank: int, steps: int) -> list[tuple[tf.Tensor, tf.Tensor]]:
    rng = np.random.default_rng(100 + rank)
    x = rng.normal(size=(steps, BATCH, FEATURES)).astype("float32")
    y = (x[..., 0] > 0).astype("int64") + 2 * (x[..., 1] > 0).astype("int64")
    return [(tf.constant(x[i]), tf.constant(y[i])) for i in range(steps)]


def original(steps: int) -> tuple[int, list[float], list[tf.Variable]]:
    """Horovod's idiom, as its examples write it."""
    import horovod.tensorflow as hvd
    hvd.init()
    weights = variables(hvd.rank())

    @tf.function
    def training_step(x, y, first_batch):
        with tf.GradientTape() as tape:
            loss = loss_of(weights, x, y)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, weights)
        for w, g in zip(weights, grads):
            w.assign_sub(LR * g)
        if first_batch:
            hvd.broadcast_variables(weights, root_rank=0)
        return loss

    losses = [float(training_step(x, y, i == 0)) for i, (x, y) in
              enumerate(batches(hvd.rank(), steps))]
    return hvd.rank(), losses, weights


def port(steps: int) -> tuple[int, list[float], list[tf.Variable]]:
    """The same loop ported (docs/coming_from_horovod.md): the group from $CROSSOVER_GROUP,
    the step inside hold_device, the strategy's tape, the broadcast eagerly after the first
    step; no scope(), and Horovod's rank still read through hvd (backend "auto" is Horovod
    under horovodrun, and the strategy called hvd.init())."""
    import horovod.tensorflow as hvd

    import crossover_tf
    strategy = crossover_tf.CrossoverStrategy(lease=crossover_tf.LeaseOptions(jobs=1))
    assert strategy.is_crossover and hvd.rank() == strategy.rank, (hvd.rank(), strategy.rank)
    weights = variables(hvd.rank())

    @tf.function
    def training_step(x, y):
        with strategy.hold_device():
            with tf.GradientTape() as tape:
                loss = loss_of(weights, x, y)
            tape = strategy.gradient_tape(tape, sparse_as_dense=True, op=hvd.Average)
            grads = tape.gradient(loss, weights)
            for w, g in zip(weights, grads):
                w.assign_sub(LR * g)
        return loss

    losses = []
    for i, (x, y) in enumerate(batches(hvd.rank(), steps)):
        losses.append(float(training_step(x, y)))
        if i == 0:
            strategy.broadcast_variables(weights)
    strategy.leave_device()
    return strategy.rank, losses, weights


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--original", action="store_true")
    mode.add_argument("--port", action="store_true")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    rank, losses, weights = (original if args.original else port)(args.steps)
    write_rank_result(args.out, rank, {"losses": losses,
                                       "weights": [w.numpy().tolist() for w in weights]})


if __name__ == "__main__":
    main()
