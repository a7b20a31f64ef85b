"""TensorFlow's multi-worker custom training loop, in the tutorial's shape, under a strategy
chosen by flag: MultiWorkerMirroredStrategy, CrossoverStrategy with only the strategy line
changed, or none (one process on the global batch). Writes what it saw as JSON.

Run under `python -m crossover_tf.launch` (each task's TF_CONFIG) by
tests/multiprocess/test_mwms_port.py.

  mwms_loop_worker.py OUT --strategy {mwms,crossover,none} [--group G] [--jobs N]
                      [--steps S] [--barrier DIR:N] [--dataset function|global]
                      [--mistake no_run|tape_in_run]
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from worker_output import write_rank_result  # noqa: E402

GLOBAL_BATCH = 32
FEATURES, CLASSES = 16, 4


def make_strategy(args: argparse.Namespace):  # noqa: ANN201 -- any strategy
    if args.strategy == "mwms":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if args.strategy == "none":
        return tf.distribute.get_strategy()
    import crossover_tf
    return crossover_tf.CrossoverStrategy(
        args.group, lease=crossover_tf.LeaseOptions(jobs=args.jobs, timeout_s=60),
        communication=crossover_tf.CommunicationOptions(backend="tensorflow",
                                                        collective_timeout_s=120))


def extended_answers(strategy) -> dict:  # noqa: ANN001 -- any strategy
    """What tf.distribute code asks of strategy.extended: who checkpoints and writes
    summaries, and which variables the strategy's scope made."""
    with strategy.scope():
        inside = tf.Variable(1.0)
    outside = tf.Variable(2.0)
    extended = strategy.extended
    return {"should_checkpoint": extended.should_checkpoint,
            "should_save_summary": extended.should_save_summary,
            "created_in_scope": [extended.variable_created_in_scope(inside),
                                 extended.variable_created_in_scope(outside)]}


def global_examples(steps: int) -> tf.data.Dataset:
    rng = np.random.default_rng(123)
    x = rng.normal(size=(GLOBAL_BATCH * steps, FEATURES)).astype("float32")
    y = np.argmax(x[:, :CLASSES], axis=1).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--strategy", choices=("mwms", "crossover", "none"), required=True)
    parser.add_argument("--group", default="")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--barrier", default="")
    parser.add_argument("--dataset", choices=("function", "global"), default="function",
                        help="function: distribute_datasets_from_function (each rank its "
                        "shard); global: experimental_distribute_dataset of global batches")
    parser.add_argument("--mistake", choices=("", "no_run", "tape_in_run"), default="",
                        help="no_run: call step_fn without strategy.run; tape_in_run: wrap "
                        "the tape with strategy.gradient_tape inside strategy.run")
    args = parser.parse_args()

    strategy = make_strategy(args)
    rank = (tf.distribute.cluster_resolver.TFConfigClusterResolver().task_id or 0
            if args.strategy != "none" else 0)
    keras.utils.set_random_seed(7 + rank)  # each rank its own init: the strategy must fix it

    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)),
                                  keras.layers.Dense(32, activation="tanh"),
                                  keras.layers.Dense(CLASSES)])
        optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
        train_accuracy = keras.metrics.SparseCategoricalAccuracy()
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                             reduction="none")

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch_size = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
        return global_examples(args.steps).shard(
            input_context.num_input_pipelines, input_context.input_pipeline_id).batch(
                batch_size, drop_remainder=True)

    if args.dataset == "global":
        dataset = strategy.experimental_distribute_dataset(
            global_examples(args.steps).batch(GLOBAL_BATCH, drop_remainder=True))
    else:
        dataset = strategy.distribute_datasets_from_function(dataset_fn)

    @tf.function
    def train_step(iterator):  # noqa: ANN001, ANN202 -- the tutorial's shape
        def step_fn(inputs):  # noqa: ANN001, ANN202
            x, y = inputs
            with tf.GradientTape() as tape:
                predictions = model(x, training=True)
                per_example_loss = loss_object(y, predictions)
                loss = tf.nn.compute_average_loss(per_example_loss)
            if args.mistake == "tape_in_run":
                tape = strategy.gradient_tape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            train_accuracy.update_state(y, predictions)
            return loss

        if args.mistake == "no_run":
            return step_fn(next(iterator))
        per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    if args.barrier:
        from experiments.barrier import wait_at_barrier
        wait_at_barrier(args.barrier, f"{args.group}-{rank}-{os.getpid()}")
    iterator = iter(dataset)
    losses = [float(train_step(iterator)) for _ in range(args.steps)]
    result = {"rank": rank, "losses": losses,
              "weights": [w.tolist() for w in model.get_weights()]}
    if args.strategy != "none":
        result["extended"] = extended_answers(strategy)
    if args.strategy == "crossover":
        result["lease_stats"] = strategy.lease_stats()
        replica = {}

        @tf.function
        def probe() -> dict:
            def in_replica() -> dict:
                context = tf.distribute.get_replica_context()
                return {"sum_of_ones": context.all_reduce(tf.distribute.ReduceOp.SUM, 1.0),
                        "replica_id": tf.constant(context.replica_id_in_sync_group),
                        "replicas": tf.constant(context.num_replicas_in_sync)}
            return strategy.run(in_replica)

        replica = {k: float(v) for k, v in probe().items()}
        result["replica"] = replica
        result["surface"] = {
            "task_id": strategy.cluster_resolver.task_id,
            "local_results": len(strategy.experimental_local_results(tf.constant(1.0))),
            "gather": strategy.gather(tf.constant([[float(rank)]]), axis=0).numpy().tolist()}
    write_rank_result(args.out, rank, result)


if __name__ == "__main__":
    main()
