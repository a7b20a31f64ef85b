"""A user's training script for tests/system/test_wheel.py: run with the installed wheel only.

Copied out of the repository and run there under `horovodrun --gloo` (or `python -m
crossover_tf.launch` for the tensorflow backend), by a fresh virtual
environment's Python, so it sees nothing of the source tree: no PYTHONPATH, no ops/ build.

  wheel_user_train.py OUT --group G --barrier DIR:N [--steps N] [--backend NAME]

Without --backend the strategy gets no communication option, as the README's example: "auto"
(Horovod under horovodrun, TensorFlow's collectives otherwise).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import crossover_tf  # noqa: E402

BARRIER_TIMEOUT_S = 300.0
FEATURES, BATCH = 64, 64


def line_up(spec: str, me: str) -> None:
    """Waits, bounded, until N processes touched DIR (spec 'DIR:N'): the jobs' first steps
    trace and compile for unequal seconds, and a tiny job could finish before its peer starts."""
    directory, _, count = spec.rpartition(":")
    pathlib.Path(directory, me).touch()
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while len(os.listdir(directory)) < int(count):
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {spec}: only {os.listdir(directory)} arrived")
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--group", required=True)
    parser.add_argument("--barrier", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--backend", default=None)
    args = parser.parse_args()

    strategy = crossover_tf.CrossoverStrategy(  # two jobs cross: LeaseOptions' default
        args.group, lease=crossover_tf.LeaseOptions(timeout_s=60),
        communication=crossover_tf.CommunicationOptions(
            **({"backend": args.backend} if args.backend else {})))
    # Big enough that a step's hold lasts milliseconds: the crossed jobs then meet at the lease.
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)),
                                  keras.layers.Dense(512, activation="tanh"),
                                  keras.layers.Dense(512, activation="tanh"),
                                  keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * args.steps, FEATURES)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)
    after_first = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: (
        line_up(args.barrier, f"{os.getpid()}") if batch == 0 else None))
    history = model.fit(strategy.distribute_dataset(data), verbose=0,
                        callbacks=[*strategy.callbacks(), after_first])
    result = {"lease_stats": strategy.lease_stats(), "loss": history.history["loss"],
              "rank": strategy.rank, "size": strategy.size,
              "horovod_importable": importlib.util.find_spec("horovod") is not None,
              "crossover_tf": crossover_tf.__file__,
              # The wheel must not install the repository's generic top-level packages.
              "experiments_importable": importlib.util.find_spec("experiments") is not None,
              "models_importable": importlib.util.find_spec("models") is not None}
    pathlib.Path(args.out.replace("RANK", str(strategy.rank))).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
