"""A rank that splits its CPU into logical devices before building CrossoverStrategy, then
reports where the strategy put its variables and ops (tests/multiprocess/test_devices.py).

  device_worker.py OUT_PATTERN LOGICAL_CPUS      (RANK in OUT_PATTERN becomes the rank)
"""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402


def main(out_pattern: str, logical_cpus: int) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(logical_cpus)])
    import crossover_tf  # noqa: PLC0415 - after the device split, as a user would
    strategy = crossover_tf.CrossoverStrategy("")
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        product = tf.matmul(tf.ones((2, 4)), model.weights[0])
    report = {"rank": strategy.rank, "local_rank": strategy.local_rank,
              "device_key": strategy.device_key,
              "variable_devices": sorted({w.value.device for w in model.weights}),
              "op_device": product.device}
    with open(out_pattern.replace("RANK", str(strategy.rank)), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
