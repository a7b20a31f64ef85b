"""TensorFlow's multi-worker Keras tutorial (`fit` on a dataset of global batches), in its shape,
under MultiWorkerMirroredStrategy or CrossoverStrategy with the strategy line changed. Writes the
final weights as JSON.

MultiWorkerMirroredStrategy's fit does not run under Keras 3 on TensorFlow 2.21
(keras-team/keras#20585), so its run uses legacy Keras (tf-keras, TF_USE_LEGACY_KERAS=1), the
reference TensorFlow's own tutorial ran on; CrossoverStrategy's runs Keras 3. Both start from
the same weights (--init, an .npz), since the two Keras versions draw initial weights
differently. Run under `python -m crossover_tf.launch` by tests/multiprocess/test_mwms_port.py.

  mwms_fit_worker.py OUT --strategy {mwms,crossover} --init FILE [--group G] [--jobs N]
                     [--steps S] [--epochs E] [--barrier DIR:N]
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from worker_output import write_rank_result  # noqa: E402 -- no TensorFlow

GLOBAL_BATCH = 32
FEATURES, CLASSES = 16, 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--strategy", choices=("mwms", "crossover"), required=True)
    parser.add_argument("--init", required=True)
    parser.add_argument("--group", default="")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--barrier", default="")
    args = parser.parse_args()
    if args.strategy == "mwms":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow is imported
    import numpy as np
    import tensorflow as tf
    if args.strategy == "mwms":
        keras = tf.keras  # tf-keras
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        import keras

        import crossover_tf
        strategy = crossover_tf.CrossoverStrategy(
            args.group, lease=crossover_tf.LeaseOptions(jobs=args.jobs, timeout_s=60),
            communication=crossover_tf.CommunicationOptions(backend="tensorflow",
                                                            collective_timeout_s=120))
    rank = tf.distribute.cluster_resolver.TFConfigClusterResolver().task_id or 0

    def mnist_dataset(global_batch_size: int) -> tf.data.Dataset:  # synthetic, same shapes
        rng = np.random.default_rng(123)
        x = rng.normal(size=(GLOBAL_BATCH * args.steps, FEATURES)).astype("float32")
        y = np.argmax(x[:, :CLASSES], axis=1).astype("int64")
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch_size)

    def build_and_compile_model():  # noqa: ANN202 -- either Keras
        model = keras.Sequential([keras.Input((FEATURES,)),
                                  keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(CLASSES)])
        model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optimizer=keras.optimizers.SGD(learning_rate=0.1, momentum=0.9),
                      metrics=["accuracy"])
        return model

    multi_worker_dataset = mnist_dataset(GLOBAL_BATCH)
    with strategy.scope():
        multi_worker_model = build_and_compile_model()
    with np.load(args.init) as init:
        multi_worker_model.set_weights([init[f"w{i}"] for i in range(len(init.files))])
    if args.barrier:
        sys.path.insert(0, os.getcwd())
        from experiments.barrier import wait_at_barrier
        wait_at_barrier(args.barrier, f"{args.group}-{rank}-{os.getpid()}")
    multi_worker_model.fit(multi_worker_dataset, epochs=args.epochs,
                           steps_per_epoch=args.steps, verbose=0)

    result = {"rank": rank, "weights": [w.tolist() for w in multi_worker_model.get_weights()]}
    if args.strategy == "crossover":
        result["lease_stats"] = strategy.lease_stats()
    write_rank_result(args.out, rank, result)


if __name__ == "__main__":
    main()
