"""A Horovod user's port is the documented path (issue 60, item 3): a custom loop in Horovod's
TensorFlow 2 idiom, run as written and as docs/coming_from_horovod.md ports it, under
horovodrun with 2 ranks, ends with the same losses and weights on every rank; and the
broadcast where Horovod's idiom puts it (inside the tf.function) is refused, naming the fix.
The loop is the project's own (tests/workers/horovod_loop_worker.py), not Horovod's files."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT, launch_command, run_bounded

WORKER = str(REPO_ROOT / "tests" / "workers" / "horovod_loop_worker.py")


def _ok(result) -> None:
    assert result.returncode == 0, result.stdout[-4000:]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_horovod_loop_ported_as_documented_trains_as_the_original(tmp_path, lease_group,
                                                                    child_env):
    for mode in ("original", "port"):
        env = {**child_env, "CROSSOVER_GROUP": lease_group}
        _ok(run_bounded(launch_command("horovod", 2, sys.executable, WORKER,
                                       str(tmp_path / f"{mode}_RANK.json"), f"--{mode}",
                                       "--steps", "8"), env, 240))
    for rank in (0, 1):
        original, ported = (json.loads((tmp_path / f"{mode}_{rank}.json").read_text())
                            for mode in ("original", "port"))
        assert ported["losses"] == original["losses"], (rank, ported["losses"],
                                                        original["losses"])
        for a, b in zip(original["weights"], ported["weights"]):
            assert np.array_equal(np.asarray(a), np.asarray(b)), rank
    # The broadcast made the ranks one job: the same weights on both after training.
    weights = [json.loads((tmp_path / f"port_{rank}.json").read_text())["weights"]
               for rank in (0, 1)]
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(*weights))


BROADCAST_IN_STEP = r"""
import sys
import tensorflow as tf
import crossover_tf

strategy = crossover_tf.CrossoverStrategy(lease=crossover_tf.LeaseOptions(jobs=1))
assert strategy.is_crossover and strategy.extended.group == sys.argv[1]
w = tf.Variable([1.0, 2.0])

@tf.function
def step(first_batch):
    with strategy.hold_device():
        w.assign_add([1.0, 1.0])
    if first_batch:
        strategy.broadcast_variables([w])
    return w.read_value()

try:
    step(True)
except RuntimeError as err:
    print("refused:", err)
print("eager:", strategy.broadcast_variables([w]) is None)
strategy.leave_device()
"""


@pytest.mark.multiprocess
def test_the_broadcast_where_horovods_idiom_puts_it_is_refused_naming_the_fix(lease_group,
                                                                               child_env):
    """Horovod's idiom broadcasts inside the tf.function on the first batch; the strategy's
    broadcast (an eager check, then a collective) failed there with Horovod's AttributeError
    and no word of crossover_tf's. Now it is refused at trace, naming where to call it; the
    group here comes from $CROSSOVER_GROUP."""
    result = run_bounded([sys.executable, "-c", BROADCAST_IN_STEP, lease_group],
                         {**child_env, "CROSSOVER_GROUP": lease_group}, 180)
    _ok(result)
    refused = [line for line in result.stdout.splitlines() if line.startswith("refused:")]
    assert refused, result.stdout[-3000:]
    for part in ("inside a tf.function", "after the first step", "docs/coming_from_horovod.md"):
        assert part in refused[0], (part, refused[0])
    assert "eager: True" in result.stdout, result.stdout[-3000:]
