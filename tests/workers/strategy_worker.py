"""Trains a tiny Keras model with CrossoverStrategy (or plain Keras) and writes what it saw.

Run under `horovodrun --gloo` by tests/multiprocess/test_strategy.py. Writes JSON with per-step
losses as Keras logged them on this rank, final weights, lease stats and timeline.

  strategy_worker.py OUT --group G [--steps N] [--epochs E] [--reference] [--save DIR]
                     [--bad_xla] [--group_per_rank] [--link_turn P] [--job J] [--linger PATH]
                     [--no_callbacks] [--outside_scope] [--backend horovod|tensorflow|default]
                     [--file_callbacks DIR] [--fail_at_epoch E] [--raise_on_rank R]
                     [--train_on_batch] [--mixed_precision]
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from experiments.barrier import wait_at_barrier  # noqa: E402
from worker_output import write_rank_result  # noqa: E402

GLOBAL_BATCH = 32
FEATURES, CLASSES = 16, 4


class HostCallback(keras.layers.Layer):
    """Calls back into Python (tf.numpy_function), which XLA cannot compile."""

    def call(self, x):
        y = tf.numpy_function(lambda a: a, [x], tf.float32, stateful=False)
        return tf.ensure_shape(y, x.shape)


# Far above what float16 gradients hold: the first steps overflow, and the dynamic loss scale
# halves (skipping each such step) until it fits, so the skip path runs too.
MIXED_INITIAL_SCALE = 2.0 ** 24


def build_model(bad_xla: bool, mixed_precision: bool = False) -> keras.Model:
    layers = [keras.Input((FEATURES,)), keras.layers.Dense(64, activation="tanh")]
    if bad_xla:
        layers.append(HostCallback())
    layers += [keras.layers.Dense(64, activation="tanh"), keras.layers.Dense(CLASSES)]
    model = keras.Sequential(layers)
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    if mixed_precision:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer,
                                                        initial_scale=MIXED_INITIAL_SCALE)
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=True)
    return model


def global_dataset(steps: int) -> tf.data.Dataset:
    rng = np.random.default_rng(123)
    n = GLOBAL_BATCH * steps
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    y = (np.argmax(x[:, :CLASSES], axis=1)).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH, drop_remainder=True)


class RecordLosses(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses: list[float] = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--group", default="")
    parser.add_argument("--jobs", type=int, default=1, help="jobs in the crossover group")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--reference", action="store_true", help="plain Keras, one process")
    parser.add_argument("--save", default="")
    parser.add_argument("--bad_xla", action="store_true")
    parser.add_argument("--group_per_rank", action="store_true")
    parser.add_argument("--fit_only", action="store_true", help="skip evaluate/predict")
    parser.add_argument("--barrier", default="", help="DIR:N - wait until N processes arrive")
    parser.add_argument("--epochs", type=int, default=1, help="--steps split over this many")
    parser.add_argument("--link_turn", type=int, default=None, help="position of 2 jobs")
    parser.add_argument("--job", default="", help="the job's label on the lease")
    parser.add_argument("--backend", default="horovod", help="CommunicationOptions.backend "
                        "('default': none given, the library's default decides)")
    parser.add_argument("--linger", default="", help="after writing OUT, stay on the lease "
                        "(holding nothing) until this file exists, for at most 120 s")
    parser.add_argument("--no_callbacks", action="store_true", help="fit without "
                        "strategy.callbacks(), as a MultiWorkerMirroredStrategy port does")
    parser.add_argument("--outside_scope", action="store_true", help="build the model outside "
                        "strategy.scope()")
    parser.add_argument("--file_callbacks", default="", help="DIR: ModelCheckpoint, "
                        "BackupAndRestore and TensorBoard into DIR on every rank, as the "
                        "multi-worker tutorials give them")
    parser.add_argument("--fail_at_epoch", type=int, default=-1,
                        help="every rank raises when this epoch begins (a killed job)")
    parser.add_argument("--raise_on_rank", type=int, default=-1,
                        help="this rank alone raises when its second epoch begins")
    parser.add_argument("--train_on_batch", action="store_true", help="train with "
                        "model.train_on_batch on each of this rank's batches instead of fit "
                        "(no callbacks: a custom loop of Keras's one-batch steps)")
    parser.add_argument("--mixed_precision", action="store_true", help="the mixed_float16 "
                        "policy and a LossScaleOptimizer starting at MIXED_INITIAL_SCALE")
    args = parser.parse_args()

    if args.mixed_precision:
        keras.mixed_precision.set_global_policy("mixed_float16")
    keras.utils.set_random_seed(7)
    record = RecordLosses()
    result: dict = {}
    if args.reference:
        model = build_model(args.bad_xla, args.mixed_precision)
        model.fit(global_dataset(args.steps // args.epochs), epochs=args.epochs, verbose=0,
                  callbacks=[record])
        rank = 0
    else:
        import crossover_tf
        group = args.group
        if args.group_per_rank:
            import horovod.tensorflow as hvd
            hvd.init()
            group = f"{args.group}{hvd.rank()}"
        strategy = crossover_tf.CrossoverStrategy(
            group, lease=crossover_tf.LeaseOptions(jobs=args.jobs, timeout_s=60,
                                                   job=args.job or None),
            link_turn=(None if args.link_turn is None
                       else crossover_tf.LinkTurnOptions(position=args.link_turn)),
            communication=crossover_tf.CommunicationOptions(
                **({} if args.backend == "default" else {"backend": args.backend}),
                collective_timeout_s=120))
        rank = strategy.rank
        result.update(size=strategy.size, communicator=type(strategy.extended.comm).__name__)
        keras.utils.set_random_seed(7 + rank)  # different init per rank: broadcast must fix it
        if args.outside_scope:
            model = build_model(args.bad_xla, args.mixed_precision)
        else:
            with strategy.scope():
                model = build_model(args.bad_xla, args.mixed_precision)
        # Line the jobs up after their first step: it traces and XLA-compiles (seconds, and
        # unequal between jobs), and a tiny job could otherwise finish before its peer starts.
        line_up = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: (
            wait_at_barrier(args.barrier, f"{group}-{rank}-{os.getpid()}")
            if args.barrier and batch == 0 and not record.losses[1:] else None))
        epochs_run: list[int] = []

        def epoch_begins(epoch: int, logs: dict | None) -> None:
            epochs_run.append(epoch)
            if epoch == args.fail_at_epoch or (epoch == 1 and rank == args.raise_on_rank):
                raise RuntimeError(f"rank {rank} fails at epoch {epoch}")

        files = ([keras.callbacks.ModelCheckpoint(os.path.join(args.file_callbacks,
                                                                 "ckpt.keras")),
                  keras.callbacks.BackupAndRestore(os.path.join(args.file_callbacks, "backup")),
                  keras.callbacks.TensorBoard(os.path.join(args.file_callbacks, "logs"))]
                 if args.file_callbacks else [])
        if args.train_on_batch:
            for x, y in strategy.distribute_dataset(global_dataset(args.steps)):
                logs = model.train_on_batch(x, y, return_dict=True)
                record.losses.append(float(logs["loss"]))
            strategy.leave_device()  # out of the link turn: the peer stops waiting for us
        else:
            model.fit(strategy.distribute_dataset(global_dataset(args.steps // args.epochs)),
                      epochs=args.epochs, verbose=0,
                      callbacks=[*([] if args.no_callbacks else strategy.callbacks()), record,
                                 line_up, *files,
                                 keras.callbacks.LambdaCallback(on_epoch_begin=epoch_begins)])
        result["epochs_run"] = epochs_run
        result["lease_stats"] = strategy.lease_stats()
        if strategy.taking_link_turns:
            result["link_turn_stats"] = strategy.link_turn_stats()
            result["turn_timeline"] = strategy.link_turn_timeline().tolist()
        if strategy.is_crossover:
            result["timeline"] = strategy.lease_timeline().tolist()
        if args.fit_only:
            args.save = ""
        else:
            result["evaluate"] = model.evaluate(strategy.distribute_dataset(global_dataset(2)),
                                                verbose=0, return_dict=True)
            result["predict_shape"] = list(model.predict(np.zeros((3, FEATURES), "float32"),
                                                         verbose=0).shape)
        result["jit_compile"] = bool(model.jit_compile)
        if args.save and strategy.should_checkpoint:
            model.save(os.path.join(args.save, "model.keras"))
    if args.mixed_precision:
        result.update(loss_scale=float(model.optimizer.dynamic_scale),
                      iterations=int(model.optimizer.iterations))
    result.update(rank=rank, losses=record.losses,
                  weights=[w.tolist() for w in model.get_weights()])
    write_rank_result(args.out, rank, result)
    deadline = time.monotonic() + 120
    while args.linger and not os.path.exists(args.linger) and time.monotonic() < deadline:
        time.sleep(0.05)


if __name__ == "__main__":
    main()
