"""One rank of benchmarks/horovod_port.py: a synthetic-image training loop in Horovod's
TensorFlow 2 idiom (the shape of Horovod's tensorflow2_synthetic_benchmark.py: one fixed
random batch, a keras.applications model, SGD, a `@tf.function` step, the broadcast after the
first batch, images/s after warm-up), written by the project, run as Horovod's idiom writes it
(`original`) or ported as docs/coming_from_horovod.md says (`port`).

  horovod_port_worker.py (original | port) [--model MobileNetV2] [--image_size 224]
      [--alpha 1.0] [--classes 1000] [--batch_size 8] [--warmup_steps 5] [--steps 30]
      [--keras legacy|3] [--group_jobs 1] [--barrier DIR:COUNT]

Started under Horovod's Gloo launch (horovodrun, or the emulated cluster's launcher, which
sets the same variables); the port's group comes from $CROSSOVER_GROUP, as a ported script's
would. Legacy Keras (tf_keras) by default: Horovod's own tape and broadcast do not take Keras
3 variables (horovod#4290); `--keras 3` is for the port only. Each rank prints one line
`RESULT {json}`: its images/s over the timed steps (the job's, as Horovod's benchmark counts
them: the rank's rate times the job's size), the timed window's wall-clock start and end, and
for the port what the strategy ran on.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Callable

from experiments.file_barrier import wait_at_barrier  # Keras-free: a tf_keras rank loads it

LEARNING_RATE = 0.01  # Horovod's synthetic benchmark's


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant", choices=("original", "port"))
    parser.add_argument("--model", default="MobileNetV2", help="a keras.applications model")
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--alpha", type=float, default=1.0,
                        help="width multiplier (MobileNet and MobileNetV2 only; 1.0: not passed)")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--batch_size", type=int, default=8, help="images a rank, a step")
    parser.add_argument("--warmup_steps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--keras", choices=("legacy", "3"), default="legacy")
    parser.add_argument("--group_jobs", type=int, default=1,
                        help="the port's LeaseOptions(jobs=...): jobs in its crossover group")
    parser.add_argument("--bucket_bytes", type=int, default=None,
                        help="the port's CommunicationOptions.bucket_bytes (default: its own)")
    parser.add_argument("--barrier", default="",
                        help="DIR:COUNT: every rank of the arm waits here after warm-up, so "
                        "that jobs side by side time the same window")
    parser.add_argument("--barrier_timeout_s", type=float, default=300.0)
    args = parser.parse_args(argv)
    if args.variant == "original" and args.keras != "legacy":
        parser.error("--keras 3 is for the port: Horovod's own tape and broadcast do not take "
                     "Keras 3 variables (horovod#4290)")
    if args.warmup_steps < 1 or args.steps < 1:
        parser.error("--warmup_steps and --steps must be >= 1 (the first step broadcasts)")
    return args


def keras_library(which: str) -> Any:
    """tf_keras (legacy Keras 2, what Horovod's tape takes) or Keras 3."""
    if which == "legacy":
        import tf_keras
        return tf_keras
    import keras
    return keras


def build(keras: Any, args: argparse.Namespace, rank: int) -> tuple[Any, Any, Any, Any, Any]:
    """The model (random weights, different on every rank until the broadcast), SGD, the loss,
    and the one synthetic batch every step trains on, as Horovod's benchmark makes them."""
    import tensorflow as tf
    tf.random.set_seed(rank)
    extra = {"alpha": args.alpha} if args.alpha != 1.0 else {}
    model = getattr(keras.applications, args.model)(
        weights=None, input_shape=(args.image_size, args.image_size, 3), classes=args.classes,
        **extra)
    opt = keras.optimizers.SGD(LEARNING_RATE)
    images = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
    labels = tf.random.uniform([args.batch_size, 1], minval=0, maxval=args.classes,
                               dtype=tf.int64)

    def loss(y: Any, probs: Any) -> Any:
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, probs))

    return model, opt, loss, images, labels


def timed(step: Callable[[int], Any], args: argparse.Namespace, rank: int, size: int,
          me: str) -> dict[str, Any]:
    """Warm-up (the first step broadcasts), the barrier, then the timed steps; each step's loss
    read back so that its time is its own."""
    for i in range(args.warmup_steps):
        step(i).numpy()
    if args.barrier:
        wait_at_barrier(args.barrier, me, args.barrier_timeout_s)
    start_wall, start = time.time(), time.perf_counter()
    step_s = []
    for i in range(args.warmup_steps, args.warmup_steps + args.steps):
        began = time.perf_counter()
        loss = float(step(i).numpy())
        step_s.append(time.perf_counter() - began)
    elapsed = time.perf_counter() - start
    return {"rank": rank, "size": size,
            "images_per_s": size * args.batch_size * args.steps / elapsed,
            "elapsed_s": elapsed, "window": [start_wall, time.time()],
            "step_s": [round(s, 5) for s in step_s], "last_loss": loss}


def original(args: argparse.Namespace) -> dict[str, Any]:
    """Horovod's idiom as its examples write it."""
    import horovod.tensorflow as hvd
    import tensorflow as tf
    hvd.init()
    model, opt, loss_fn, images, labels = build(keras_library(args.keras), args, hvd.rank())

    @tf.function
    def benchmark_step(first_batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss

    return timed(lambda i: benchmark_step(i == 0), args, hvd.rank(), hvd.size(),
                 f"{os.environ.get('CROSSOVER_JOB', 'job')}.{hvd.rank()}")


def port(args: argparse.Namespace) -> dict[str, Any]:
    """The same loop ported (docs/coming_from_horovod.md): the group from $CROSSOVER_GROUP,
    the step inside hold_device, the strategy's tape, the broadcast eagerly after the first
    step, no scope()."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    import crossover_tf
    buckets = {} if args.bucket_bytes is None else {"bucket_bytes": args.bucket_bytes}
    strategy = crossover_tf.CrossoverStrategy(
        lease=crossover_tf.LeaseOptions(jobs=args.group_jobs),
        communication=crossover_tf.CommunicationOptions(**buckets))
    model, opt, loss_fn, images, labels = build(keras_library(args.keras), args, hvd.rank())

    @tf.function
    def benchmark_step():
        with strategy.hold_device():
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(images, training=True))
            tape = strategy.gradient_tape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def step(i: int) -> Any:
        loss = benchmark_step()
        if i == 0:
            strategy.broadcast_variables(model.variables + opt.variables)
        return loss

    try:
        result = timed(step, args, hvd.rank(), hvd.size(),
                       f"{os.environ.get('CROSSOVER_JOB', 'job')}.{hvd.rank()}")
    finally:
        strategy.leave_device()
    return {**result, "crossover": strategy.is_crossover, "group": strategy.group,
            "communicator": type(strategy.extended.comm).__name__,
            "horovod_rank_matches": hvd.rank() == strategy.rank,
            "lease": strategy.lease_stats(), "phases_s": median_phases(strategy),
            "bucket_bytes": strategy.extended.communication.bucket_bytes}


def median_phases(strategy: Any) -> dict[str, float]:
    """The port's median compute, exposed allreduce and apply seconds a step, from its lease
    timeline (the allreduce's exposed part: from the mid-step yield to the re-acquire)."""
    import numpy as np

    from crossover_tf.profiling import phases
    durations = phases.phase_durations(phases.step_phases(strategy.lease_timeline()))
    return {name: round(float(np.median(values)), 4) for name, values in durations.items()
            if len(values)}


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    # Before TensorFlow loads: tf.keras is then the Keras the loop uses (tf_keras or Keras 3).
    os.environ["TF_USE_LEGACY_KERAS"] = "1" if args.keras == "legacy" else "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result = (original if args.variant == "original" else port)(args)
    print("RESULT " + json.dumps({"variant": args.variant, "keras": args.keras, **result}),
          flush=True)


if __name__ == "__main__":
    main()
