"""The lease ops on a real GPU (skipped without one; scripts/gpu_check.sh runs them)."""
from __future__ import annotations

import time

import numpy as np
import pytest
import tensorflow as tf

from crossover_tf import lease as lease_lib

pytestmark = pytest.mark.needs_gpu


@pytest.fixture
def lease(lease_group: str) -> lease_lib.DeviceLease:
    gpu = tf.config.list_physical_devices("GPU")[0]
    tf.config.experimental.set_memory_growth(gpu, True)
    held = lease_lib.DeviceLease(lease_group, "gpu0")
    yield held
    held.yield_device()


def test_device_tensors_pass_through_on_the_gpu(lease: lease_lib.DeviceLease) -> None:
    with tf.device("/GPU:0"):
        x = tf.random.normal([256, 256])
        y = lease.yield_device(lease.acquire(x))
    assert y.device.endswith("GPU:0"), y.device
    np.testing.assert_array_equal(x.numpy(), y.numpy())


def test_yield_waits_for_the_compute_stream(lease: lease_lib.DeviceLease) -> None:
    """GPU ops only enqueue kernels; releasing before they finish would let the peer start
    while ours still run. The release must come after the work is done."""

    @tf.function
    def step(x: tf.Tensor) -> tf.Tensor:
        x = lease.acquire(x)
        for _ in range(40):
            x = tf.tanh(tf.matmul(x, x) * 1e-3)
        return lease.yield_device(x)

    with tf.device("/GPU:0"):
        x = tf.random.normal([8192, 8192])
        step(x).numpy()  # trace and warm up
        start = time.time_ns()
        step(x).numpy()
        done = time.time_ns()
    released = int(lease.timeline()[-1, 2])
    assert released >= done - 0.2 * (done - start), (start, released, done)


def test_eager_release_without_tensors_runs_on_the_host(lease: lease_lib.DeviceLease) -> None:
    lease.acquire()
    lease.yield_device()  # must not need the GPU stream (a failed stream must not block it)
    assert not lease.stats().held
