"""One job for tests/multiprocess/test_priority.py, of one rank or launched with several: trains
a small dense model with a given priority and micro-batching, and writes its losses, weights and
lease timeline per rank (RANK in OUT is replaced by the rank).

  priority_worker.py OUT --group G --priority P --micro_batches N [--steps S] [--barrier D:C]
                     [--backend horovod|tensorflow|auto]
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import crossover_tf  # noqa: E402
from experiments.barrier import wait_at_barrier  # noqa: E402
from worker_output import write_rank_result  # noqa: E402

BATCH, FEATURES, CLASSES = 32, 16, 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--group", default="")
    parser.add_argument("--jobs", type=int, default=1, help="jobs in the crossover group")
    parser.add_argument("--priority", default="normal")
    parser.add_argument("--micro_batches", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--barrier", default="")
    # A job of one rank runs no allreduce; launched with two, the step's allreduce is real and
    # the primary's yield gives the secondary its chance.
    parser.add_argument("--backend", default="horovod", help="CommunicationOptions.backend")
    args = parser.parse_args()
    strategy = crossover_tf.CrossoverStrategy(
        args.group, lease=crossover_tf.LeaseOptions(jobs=args.jobs, priority=args.priority),
        communication=crossover_tf.CommunicationOptions(backend=args.backend))
    keras.utils.set_random_seed(1)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * args.steps, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=(BATCH * args.steps,))
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)),
                                  keras.layers.Dense(args.width, activation="tanh"),
                                  keras.layers.Dense(args.width, activation="tanh"),
                                  keras.layers.Dense(CLASSES)])
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=True)
    # Trace, compile and broadcast before lining up, so the timed fits really run together.
    crossing = strategy.callbacks(micro_batches=args.micro_batches)
    model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, verbose=0, callbacks=crossing)
    if args.barrier:
        wait_at_barrier(args.barrier, f"{args.priority}-{strategy.rank}-{os.getpid()}")
    losses = []
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[*crossing, keras.callbacks.LambdaCallback(
                  on_train_batch_end=lambda batch, logs: losses.append(float(logs["loss"])))])
    report = {"losses": losses, "weights": [w.tolist() for w in model.get_weights()],
              "device_key": strategy.device_key if strategy.is_crossover else "",
              "timeline": (strategy.lease_timeline().tolist()
                         if strategy.is_crossover else [])}
    write_rank_result(args.out, strategy.rank, report)


if __name__ == "__main__":
    main()
