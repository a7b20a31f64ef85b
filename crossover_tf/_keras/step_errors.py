"""A Keras step function that fails leaves the device and the link turn, and says why XLA
failed when it did.

Why: a step that raised would otherwise keep the device leased (or the peer waiting for our
link turn) for as long as this process lives, as a notebook's kernel does.
"""
from __future__ import annotations

import re
from typing import Any, Callable

import tensorflow as tf

from crossover_tf._protocol.step_protocol import StepProtocol

_XLA_FAILURE = re.compile(r"XLA|compil", re.IGNORECASE)
_XLA_ERROR_TYPES = (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError)


def leave_on_error(function: Callable[[Any], Any], protocol: StepProtocol, jit_compile: bool,
                   what: str) -> Callable[[Any], Any]:
    """function, leaving for good when it raises (StopIteration, the end of data, aside);
    an XLA compile failure becomes a RuntimeError that names the fix."""

    def guarded(iterator: Any) -> Any:
        try:
            return function(iterator)
        except StopIteration:
            raise
        except tf.errors.OpError as err:
            protocol.leave()
            if (jit_compile and isinstance(err, _XLA_ERROR_TYPES)
                    and _XLA_FAILURE.search(err.message or "")):
                raise RuntimeError(
                    f"crossover_tf: XLA could not compile the model's {what} computation "
                    "(model.compile(jit_compile=True)). Compile the model with "
                    "jit_compile=False (or 'auto', which lets Keras decide), or replace the "
                    f"unsupported op. TensorFlow said: {err.message[:2000]}") from err
            raise
        except BaseException:
            protocol.leave()
            raise

    return guarded
