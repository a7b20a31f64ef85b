"""The custom loop's gradient buckets (issue 60, item 1): filled from the last gradient back,
as the backward pass makes them, each about CommunicationOptions.bucket_bytes; and a traced
reduction yields the device before any collective, which starts on the raw gradients."""
from __future__ import annotations

import pytest
import tensorflow as tf

from crossover_tf._communication.communicator import gradients_in_buckets
from crossover_tf.options import DEFAULT_BUCKET_BYTES, CommunicationOptions


def _tensors(*sizes: int) -> list[tf.Tensor]:
    return [tf.zeros([n], tf.float32) for n in sizes]


def test_buckets_fill_from_the_last_gradient_backwards():
    # 4-byte floats: 100, 10, 300, 5 elements -> 400, 40, 1200, 20 bytes.
    tensors = _tensors(100, 10, 300, 5)
    assert gradients_in_buckets(tensors, 1000) == [[3, 2], [1, 0]]
    assert gradients_in_buckets(tensors, 1) == [[3], [2], [1], [0]]
    assert gradients_in_buckets(tensors, 400) == [[3, 2], [1, 0]]
    assert gradients_in_buckets(tensors, 10_000) == [[3, 2, 1, 0]]


def test_zero_means_one_bucket_in_order_and_every_index_once():
    tensors = _tensors(7, 8, 9)
    assert gradients_in_buckets(tensors, 0) == [[0, 1, 2]]
    assert gradients_in_buckets([], 0) == [] == gradients_in_buckets([], 64)
    for size in (1, 30, 64, 100):
        buckets = gradients_in_buckets(tensors, size)
        assert sorted(i for b in buckets for i in b) == [0, 1, 2]


def test_a_tensor_of_unknown_size_gets_a_bucket_of_its_own():
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def buckets(x):
        tensors = [tf.zeros([2]), x, tf.zeros([2])]
        return tf.constant(str(gradients_in_buckets(tensors, 64)))
    assert buckets(tf.zeros([3])).numpy().decode() == "[[2, 1], [0]]"


def test_bucket_bytes_option():
    assert CommunicationOptions().bucket_bytes == DEFAULT_BUCKET_BYTES == 4 << 20
    assert CommunicationOptions(bucket_bytes=0).bucket_bytes == 0
    for bad in (-1, 1.5, True, "4MB"):
        with pytest.raises(ValueError, match="bucket_bytes must be a whole number"):
            CommunicationOptions(bucket_bytes=bad)
