"""strategy.hold_device() refuses, at trace time, every op that would wait on the network
while the device is held: TensorFlow's and NCCL's collectives as Horovod's (those are run for
real in tests/multiprocess/test_custom_loop.py), inside tf.switch_case branches too, and
Python ops whose body cannot be read. Nothing here runs a collective: the hold refuses while
the tf.function is traced, in this one process."""
from __future__ import annotations

import pytest
import tensorflow as tf

from crossover_tf._hold.custom_loop import COLLECTIVE_OPS, DeviceHold
from crossover_tf.lease import DeviceLease


@pytest.fixture
def lease(lease_group: str, tmp_path) -> DeviceLease:
    return DeviceLease(lease_group, "cpu0", timeout_s=10, lease_dir=tmp_path)


def _reduce(x: tf.Tensor) -> tf.Tensor:
    return tf.raw_ops.CollectiveReduceV2(input=x, group_size=2, group_key=1, instance_key=1,
                                         ordering_token=[], merge_op="Add", final_op="Id",
                                         timeout_seconds=5)


def _gather(x: tf.Tensor) -> tf.Tensor:
    return tf.raw_ops.CollectiveGatherV2(input=x, group_size=2, group_key=1, instance_key=2,
                                         ordering_token=[], timeout_seconds=5)


def _broadcast(x: tf.Tensor) -> tf.Tensor:
    return tf.raw_ops.CollectiveBcastSendV2(input=x, group_size=2, group_key=1, instance_key=3,
                                            timeout_seconds=5)


def _in_switch_case(x: tf.Tensor) -> tf.Tensor:
    return tf.switch_case(tf.constant(1), [lambda: x * 2.0, lambda: _reduce(x)])


def _in_nested_function(x: tf.Tensor) -> tf.Tensor:
    return tf.function(_gather)(x)


def _py_function(x: tf.Tensor) -> tf.Tensor:
    return tf.py_function(lambda t: t * 2.0, [x], tf.float32)


def _numpy_function(x: tf.Tensor) -> tf.Tensor:
    return tf.numpy_function(lambda t: t * 2.0, [x], tf.float32)


@pytest.mark.parametrize("body, op_type, words", [
    (_reduce, "CollectiveReduceV2", "collective(s)"),
    (_gather, "CollectiveGatherV2", "collective(s)"),
    (_broadcast, "CollectiveBcastSendV2", "collective(s)"),
    (_in_switch_case, "CollectiveReduceV2", "collective(s)"),
    (_in_nested_function, "CollectiveGatherV2", "collective(s)"),
    (_py_function, "EagerPyFunc", "Python op(s)"),
    (_numpy_function, "PyFunc", "Python op(s)"),
])
def test_a_hold_refuses_ops_that_wait_on_the_network(lease, body, op_type, words):
    @tf.function
    def step(x):
        with DeviceHold(lease):
            return body(x) + 1.0

    with pytest.raises(ValueError, match="inside strategy.hold_device") as err:
        step(tf.ones([2]))
    assert op_type in str(err.value) and words in str(err.value)


def test_a_hold_accepts_device_work_and_the_same_ops_outside_it(lease):
    @tf.function
    def step(x):
        with DeviceHold(lease):
            y = tf.switch_case(tf.constant(0), [lambda: x * 2.0, lambda: x * 3.0])
            y = tf.function(lambda t: tf.reduce_sum(t * t), jit_compile=True)(y)
        return _py_function(y)  # outside the hold: allowed

    assert float(step(tf.ones([2]))) == pytest.approx(16.0)
    assert lease.stats().acquires == 1 and not lease.stats().held


def test_the_refused_set_covers_every_collective_op_tensorflow_registers():
    """A TensorFlow release that adds a collective op must not slip past the check."""
    registered = {name for name in dir(tf.raw_ops)
                  if name.startswith(("Collective", "Nccl")) and "Group" not in name}
    assert registered <= COLLECTIVE_OPS, sorted(registered - COLLECTIVE_OPS)
