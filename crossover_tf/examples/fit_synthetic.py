"""A small Keras classifier on synthetic data, trained with `fit` under CrossoverStrategy: the
job the deploy/ recipes run, `python -m crossover_tf.examples.fit_synthetic --group=pair0 ...`.

Why synthetic: an image built from this repository holds no dataset, and a recipe must run as
written. The labels come from a fixed random linear teacher (the same seed on every rank), so
the loss falls within a few steps and a job that does not train shows it. Swap in your own
script: build the model under `strategy.scope()`, give `fit` `strategy.distribute_dataset(...)`
and `strategy.callbacks()`, and keep the group's flags (README, "Use it with fit").

Every rank prints one line, SUMMARY followed by JSON: job, rank, size, group, device, steps and
the loss of each epoch.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

SUMMARY = "crossover_tf example: "
DISTINCT_BATCHES = 32   # global batches of synthetic data, repeated: enough to learn from


def _flag_parser() -> argparse.ArgumentParser:
    """The flags, named as experiments/train.py names them, so that the launch lines
    `crossover-plan pair --slurm` writes (--group, --group_jobs, --join_timeout_s,
    --link_turn) run this job as they are."""
    parser = argparse.ArgumentParser(prog="python -m crossover_tf.examples.fit_synthetic",
                                     description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--job", default="", help="this job's name on the lease (`lease status` shows it)")
    add("--group", default=None, help="the crossover group shared with the peer job on the "
        "same devices (default: $CROSSOVER_GROUP; empty: plain data parallelism, no lease)")
    add("--group_jobs", type=int, default=2, help="how many jobs the group has (1: alone)")
    add("--join_timeout_s", type=float, default=120.0,
        help="the longest this job waits at start for the group's other jobs")
    add("--link_turn", type=int, default=-1,
        help="this job's position in the group's allreduce order (-1: no link turns)")
    add("--lease_dir", default="", help="the lease directory (default $CROSSOVER_LEASE_DIR, "
        "else /dev/shm)")
    add("--backend", default="auto", help="auto, horovod or tensorflow "
        "(CommunicationOptions.backend; auto: Horovod under horovodrun)")
    add("--steps", type=int, default=100, help="steps per epoch")
    add("--epochs", type=int, default=1)
    add("--batch_size", type=int, default=64, help="global batch, split over the ranks")
    add("--features", type=int, default=32)
    add("--classes", type=int, default=10)
    add("--hidden", type=int, default=64, help="width of the one hidden layer")
    add("--learning_rate", type=float, default=0.05)
    add("--seed", type=int, default=0, help="data, teacher and initial weights")
    add("--jit_compile", action=argparse.BooleanOptionalAction, default=True,
        help="compile the step with XLA")
    return parser


FLAG_NAMES = tuple(vars(_flag_parser().parse_args([])))  # what a recipe may pass


def parse_flags(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, checked: sizes positive (argparse exits with a message otherwise)."""
    parser = _flag_parser()
    args = parser.parse_args(argv)
    for name in ("steps", "epochs", "batch_size", "features", "classes", "hidden"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    return args


def _strategy(args: argparse.Namespace) -> Any:
    """The strategy from the flags (each option group checks itself when made)."""
    import crossover_tf
    lease = crossover_tf.LeaseOptions(jobs=args.group_jobs, join_timeout_s=args.join_timeout_s,
                                      lease_dir=args.lease_dir or None, job=args.job or None)
    link_turn = (crossover_tf.LinkTurnOptions(position=args.link_turn)
                 if args.link_turn >= 0 else None)
    return crossover_tf.CrossoverStrategy(
        args.group, lease=lease, link_turn=link_turn,
        communication=crossover_tf.CommunicationOptions(backend=args.backend))


def _global_batches(args: argparse.Namespace) -> Any:
    """The same global batches on every rank, repeated: features and the teacher's labels."""
    import numpy as np
    import tensorflow as tf
    rng = np.random.default_rng(args.seed)
    teacher = rng.normal(size=(args.features, args.classes))
    x = rng.normal(size=(DISTINCT_BATCHES * args.batch_size, args.features)).astype("float32")
    y = np.argmax(x @ teacher, axis=1).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch_size).repeat()


def _compiled_model(args: argparse.Namespace, strategy: Any) -> Any:
    import keras
    keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = keras.Sequential([keras.Input((args.features,)),
                                  keras.layers.Dense(args.hidden, activation="relu"),
                                  keras.layers.Dense(args.classes)])
        model.compile(optimizer=keras.optimizers.SGD(args.learning_rate, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], jit_compile=args.jit_compile)
    return model


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Trains this rank's part of the job; returns its summary."""
    strategy = _strategy(args)
    if args.batch_size % strategy.size:
        raise SystemExit(f"--batch_size={args.batch_size} does not split over the job's "
                         f"{strategy.size} ranks")
    model = _compiled_model(args, strategy)
    history = model.fit(strategy.distribute_dataset(_global_batches(args)), epochs=args.epochs,
                        steps_per_epoch=args.steps, shuffle=False,  # the data is random
                        verbose=2 if strategy.rank == 0 else 0,
                        callbacks=strategy.callbacks())
    return {"job": args.job, "rank": strategy.rank, "size": strategy.size,
            "group": strategy.group, "device_key": strategy.device_key,
            "steps": args.steps * args.epochs,
            "loss_per_epoch": [float(v) for v in history.history["loss"]],
            "accuracy": float(history.history["accuracy"][-1])}


def main(argv: Sequence[str] | None = None) -> int:
    summary = train(parse_flags(argv))
    print(SUMMARY + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
