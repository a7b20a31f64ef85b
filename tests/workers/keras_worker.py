"""Keras-user scenarios run with CrossoverStrategy; each writes what it saw as JSON.

Run by tests/multiprocess/test_keras_semantics.py, under `horovodrun --gloo` or as one process:

  keras_worker.py SCENARIO OUT [--group G] [--barrier DIR:N] [--ckpt PATH]

Scenarios: recompile, broadcast, mismatch, jit_off, warm_up, user_script (see each function).
OUT may contain RANK, replaced by this process's rank.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from experiments.barrier import wait_at_barrier  # noqa: E402
from strategy_worker import CLASSES, FEATURES, RecordLosses, global_dataset  # noqa: E402

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
LEASE_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lease_worker.py")


def weights_of(model: keras.Model) -> list[list]:
    return [w.tolist() for w in model.get_weights()]


def optimizer_state(model: keras.Model) -> list[list]:
    return [np.asarray(v).tolist() for v in model.optimizer.variables]


def fit(model: keras.Model, strategy, steps: int, **kwargs) -> keras.callbacks.History:
    return model.fit(strategy.distribute_dataset(global_dataset(steps)), verbose=0,
                     **{"callbacks": strategy.callbacks(), **kwargs})


# ----- issue item 1: a recompile rebuilds the step -------------------------------------------
def recompile(strategy, args) -> dict:
    """Freeze the backbone, fit, unfreeze and recompile, fit, recompile with SGD(0), fit."""
    backbone = keras.layers.Dense(32, activation="tanh", name="backbone")
    model = keras.Sequential([keras.Input((FEATURES,)), backbone,
                              keras.layers.Dense(CLASSES, name="head")])
    phases = {"initial": weights_of(model)}
    backbone.trainable = False
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=LOSS, jit_compile=True)
    fit(model, strategy, 3)
    phases["frozen"] = weights_of(model)
    backbone.trainable = True
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=LOSS, jit_compile=True)
    fit(model, strategy, 3)
    phases["unfrozen"] = weights_of(model)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss=LOSS, jit_compile=True)
    fit(model, strategy, 3)
    phases["lr0"] = weights_of(model)
    return phases


# ----- issue item 2: the initial broadcast -----------------------------------------------------
class Subclassed(keras.Model):
    """No Input: variables exist only once the model has seen a batch."""

    def __init__(self, extra_units: int = 0):
        super().__init__()
        self.hidden = keras.layers.Dense(32 + extra_units, activation="tanh")
        self.out = keras.layers.Dense(CLASSES)

    def call(self, x):
        return self.out(self.hidden(x))


class RecordAfterFirstStep(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.state: dict = {}

    def on_train_batch_end(self, batch, logs=None):
        if batch == 0 and not self.state:
            self.state = {"weights": weights_of(self.model),
                          "optimizer": optimizer_state(self.model)}


def broadcast(strategy, args) -> dict:
    """Differently seeded ranks (seeded in main), a subclassed model and Adam; then a model
    restored from a checkpoint on rank 0 only and trained with learning rate 0."""
    model = Subclassed()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=LOSS, jit_compile=True)
    first = RecordAfterFirstStep()
    fit(model, strategy, 4, callbacks=[*strategy.callbacks(), first])
    result = {"first": first.state, "last": {"weights": weights_of(model),
                                              "optimizer": optimizer_state(model)}}
    fresh = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8),
                              keras.layers.Dense(CLASSES)])
    fresh.compile(optimizer=keras.optimizers.SGD(0.0), loss=LOSS)
    if strategy.rank == 0:
        fresh.save(args.ckpt)
        fresh = keras.models.load_model(args.ckpt)
    fit(fresh, strategy, 2)
    result["restored"] = weights_of(fresh)
    return result


def mismatch(strategy, args) -> dict:
    """Rank 1 builds a wider layer than rank 0: the broadcast must refuse, naming it."""
    model = Subclassed(extra_units=strategy.rank)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=LOSS)
    fit(model, strategy, 2)
    return {}


# ----- issue item 4: with jit off no op escapes the hold ---------------------------------------
STAMPS: list[int] = []


def stamp() -> tf.Tensor:
    """An op with no inputs that records when it ran (wall clock, like the lease timeline)."""
    def record():
        STAMPS.append(time.time_ns())
        return np.float32(0.0)
    return tf.py_function(record, [], tf.float32)


class StampedL2(keras.regularizers.Regularizer):
    def __call__(self, kernel):
        return 1e-4 * tf.reduce_sum(tf.square(kernel)) + stamp()


class StampedSchedule(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        return 0.05 / (1.0 + tf.cast(step, tf.float32)) + stamp()


def hold_lease_for(strategy, seconds: float, ready: str) -> None:
    """A peer process takes the lease and keeps it for `seconds` (it is killed, then)."""
    holder = subprocess.Popen([sys.executable, LEASE_WORKER, "hold", strategy.group,
                               strategy.device_key, ready])
    deadline = time.monotonic() + 60
    while not os.path.exists(ready):
        if time.monotonic() > deadline:
            raise TimeoutError("lease holder did not start")
        time.sleep(0.02)
    threading.Timer(seconds, lambda: (holder.kill(), holder.wait())).start()


def jit_off(strategy, args) -> dict:
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(16, activation="tanh", kernel_regularizer=StampedL2()),
        keras.layers.Dense(CLASSES)])
    model.compile(optimizer=keras.optimizers.SGD(StampedSchedule()), loss=LOSS,
                  jit_compile=False)
    hold_lease_for(strategy, 1.5, args.out + ".ready")
    fit(model, strategy, 4)
    return {"stamps": STAMPS, "timeline": strategy.lease_timeline().tolist()}


# ----- issue item 6: XLA compiles outside the lease --------------------------------------------
def warm_up(strategy, args) -> dict:
    model = keras.Sequential([keras.Input((FEATURES,)),
                              *[keras.layers.Dense(128, activation="tanh") for _ in range(6)],
                              keras.layers.Dense(CLASSES)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=LOSS, jit_compile=True)
    fit(model, strategy, 8)
    return {"timeline": strategy.lease_timeline().tolist()}


# ----- the whole user script, crossed or plain -------------------------------------------------
class RecordEvaluation(keras.callbacks.Callback):
    """Wall-clock bounds of every test batch, and whether the lease is held at epoch ends."""

    def __init__(self, strategy):
        super().__init__()
        self.strategy = strategy
        self.test_batches: list[list[int]] = []
        self.held_at_epoch_end: list[bool] = []

    def on_test_batch_begin(self, batch, logs=None):
        self.test_batches.append([time.time_ns(), 0])

    def on_test_batch_end(self, batch, logs=None):
        self.test_batches[-1][1] = time.time_ns()

    def on_epoch_end(self, epoch, logs=None):
        self.held_at_epoch_end.append(bool(self.strategy.lease_stats().get("held", 0.0)))


def build_user_model() -> keras.Model:
    inputs = keras.Input((FEATURES,))
    h = keras.layers.Dense(32)(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Activation("relu")(h)
    h = keras.layers.Dropout(0.25)(h)
    model = keras.Model(inputs, keras.layers.Dense(CLASSES)(h))
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=4, decay_rate=0.9)
    model.compile(optimizer=keras.optimizers.Adam(schedule), loss=LOSS, metrics=["accuracy"],
                  jit_compile=True)
    return model


def user_script(strategy, args) -> dict:
    model = build_user_model()
    record, evaluation = RecordLosses(), RecordEvaluation(strategy)
    callbacks = [*strategy.callbacks(), record, evaluation,
                 keras.callbacks.EarlyStopping(monitor="val_loss", patience=1)]
    if strategy.should_checkpoint:
        callbacks.append(keras.callbacks.ModelCheckpoint(args.ckpt))
    if args.barrier:
        wait_at_barrier(args.barrier, f"{strategy.group}-{strategy.rank}-{os.getpid()}")
    history = model.fit(strategy.distribute_dataset(global_dataset(6).repeat()), epochs=3,
                        steps_per_epoch=6, validation_data=strategy.distribute_dataset(
                            global_dataset(2)), callbacks=callbacks, verbose=0)
    strategy.reduce("sum", tf.constant(0.0))  # a barrier: rank 0 has written the checkpoint
    evaluated = model.evaluate(strategy.distribute_dataset(global_dataset(2)), verbose=0,
                               return_dict=True)
    probe = global_dataset(1).map(lambda x, y: x)
    predicted = model.predict(probe, verbose=0)
    reloaded = keras.models.load_model(args.ckpt)
    strategy.prepare(reloaded)
    bn = next(layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization))
    return {"losses": record.losses, "history": history.history,
            "evaluate": evaluated, "predict": predicted.tolist(),
            "reloaded_predict": reloaded.predict(probe, verbose=0).tolist(),
            "reloaded_evaluate": reloaded.evaluate(
                strategy.distribute_dataset(global_dataset(2)), verbose=0, return_dict=True),
            "trainable": [w.numpy().tolist() for w in model.trainable_weights],
            "bn_moving_mean": bn.moving_mean.numpy().tolist(),
            "test_batches": evaluation.test_batches,
            "held_at_epoch_end": evaluation.held_at_epoch_end,
            "timeline": (strategy.lease_timeline().tolist()
                         if strategy.is_crossover else [])}


SCENARIOS = {f.__name__: f for f in (recompile, broadcast, mismatch, jit_off, warm_up,
                                     user_script)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("out")
    parser.add_argument("--group", default="")
    parser.add_argument("--jobs", type=int, default=1, help="jobs in the crossover group")
    parser.add_argument("--barrier", default="", help="DIR:N - wait until N processes arrive")
    parser.add_argument("--ckpt", default="", help="model file the scenario may write")
    args = parser.parse_args()
    import crossover_tf
    strategy = crossover_tf.CrossoverStrategy(
        args.group, lease=crossover_tf.LeaseOptions(jobs=args.jobs, timeout_s=60))
    args.ckpt = args.ckpt.replace("RANK", str(strategy.rank))
    keras.utils.set_random_seed(7 + strategy.rank)  # different per rank: broadcast must fix it
    result = SCENARIOS[args.scenario](strategy, args)
    with open(args.out.replace("RANK", str(strategy.rank)), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
