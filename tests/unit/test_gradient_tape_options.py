"""strategy.gradient_tape takes hvd.DistributedGradientTape's options a port keeps (issue 63,
item 5; issue 60, item 3): compression as the job is set, sparse_as_dense, op=Average; each
other option is refused by name, saying why, never ignored."""
from __future__ import annotations

import inspect

import pytest

from crossover_tf import CrossoverStrategy
from crossover_tf._protocol.gradient_tape import NOT_TAKEN, check_horovod_options
from crossover_tf.options import CommunicationOptions

HOROVOD = CommunicationOptions(backend="horovod")


class NoneCompressor:  # stands in for hvd.Compression.none, matched by its name
    pass


class FP16Compressor:
    pass


def test_the_strategy_method_takes_the_options_by_keyword():
    parameters = inspect.signature(CrossoverStrategy.gradient_tape).parameters
    assert {"compression", "sparse_as_dense", "op"} <= set(parameters)
    assert parameters["compression"].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.mark.parametrize("compression", [None, NoneCompressor])
@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_what_a_port_keeps_is_accepted(compression, sparse_as_dense):
    check_horovod_options(HOROVOD, compression, sparse_as_dense, 0, {})
    check_horovod_options(HOROVOD, compression, sparse_as_dense, None, {})


def test_compression_is_the_jobs():
    fp16 = CommunicationOptions(backend="horovod", compression=FP16Compressor)
    check_horovod_options(fp16, FP16Compressor, False, None, {})
    check_horovod_options(fp16, None, False, None, {})  # as the job is set
    with pytest.raises(ValueError, match=r"CommunicationOptions\(compression=\.\.\.\)"):
        check_horovod_options(HOROVOD, FP16Compressor, False, None, {})
    with pytest.raises(ValueError, match="compresses"):
        check_horovod_options(fp16, NoneCompressor, False, None, {})
    with pytest.raises(ValueError, match="compression is Horovod's"):
        check_horovod_options(CommunicationOptions(backend="tensorflow"), FP16Compressor,
                              False, None, {})


def test_op_other_than_average_is_refused():
    with pytest.raises(ValueError, match="op=hvd.Average"):
        check_horovod_options(HOROVOD, None, False, 1, {})


@pytest.mark.parametrize("name", sorted(NOT_TAKEN))
def test_every_other_option_is_refused_by_name_with_why(name):
    with pytest.raises(ValueError, match=rf"does not take Horovod's {name}: "):
        check_horovod_options(HOROVOD, None, False, None, {name: object()})


def test_an_unknown_option_is_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'compresion'"):
        check_horovod_options(HOROVOD, None, False, None, {"compresion": None})
