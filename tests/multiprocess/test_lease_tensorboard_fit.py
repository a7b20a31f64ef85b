"""crossover_tf.LeaseTensorBoard in a real leased fit: a job of one rank in a group
of its own logs its lease wait, hold and held share per step, read back from the events."""
from __future__ import annotations

import sys

import pytest

from conftest import run_bounded
from tensorboard_events import read_scalars

STEPS = 8
LEASED_FIT = """
import sys
import keras, numpy as np
import crossover_tf
from crossover_tf import LeaseTensorBoard
strategy = crossover_tf.CrossoverStrategy(sys.argv[1], lease=crossover_tf.LeaseOptions(jobs=1))
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
x, y = np.ones((8 * int(sys.argv[3]), 4), "float32"), np.ones((8 * int(sys.argv[3]), 2), "float32")
model.fit(x, y, batch_size=8, verbose=0,
          callbacks=[*strategy.callbacks(), LeaseTensorBoard(strategy, sys.argv[2])])
print("acquires", strategy.lease_stats()["acquires"])
"""


@pytest.mark.multiprocess
def test_a_leased_fit_logs_its_lease_wait_hold_and_share(tmp_path, lease_group, child_env):
    result = run_bounded([sys.executable, "-c", LEASED_FIT, lease_group, str(tmp_path),
                          str(STEPS)], child_env, timeout=180)
    assert result.returncode == 0, result.stdout[-4000:]
    scalars = read_scalars(tmp_path)
    for tag in ("lease_wait_s", "lease_hold_s", "lease_held_share"):
        assert [step for step, _ in scalars[tag]] == list(range(STEPS)), tag
    assert all(0 <= v < 5 for _, v in scalars["lease_wait_s"])  # alone: no peer to wait on
    assert all(0 < v < 60 for _, v in scalars["lease_hold_s"])  # every step held the device
    assert all(0 < v <= 1 for _, v in scalars["lease_held_share"])
