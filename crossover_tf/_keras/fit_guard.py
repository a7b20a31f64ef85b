"""A fit that ends any way at all ends out of the link turn and without the device.

Why: Keras 3's fit has no `finally`, so an error raised by a callback, or a Ctrl-C between
steps, skips both on_train_end and the step function's guard (step_errors), and the peer job
would wait for our link turn (up to LinkTurnOptions.wait_s) on every allreduce for as long as this
process lives, as a notebook's kernel does. Why the class: our hooks are installed from inside
fit (Keras calls set_model while fit builds its callbacks), too late to wrap the call already
running; the class's fit is wrapped before the first one starts.
"""
from __future__ import annotations

import functools
from typing import Any

import keras

from crossover_tf._keras.install import installed_protocol


def guard_fit(model_class: type = keras.Model) -> None:
    """Makes model_class.fit (once per process) leave for good when it returns or raises, for
    models with crossover hooks installed; others are untouched."""
    fit = model_class.fit
    if getattr(fit, "_crossover_guarded", False):
        return

    @functools.wraps(fit)
    def fit_then_leave(model: keras.Model, *args: Any, **kwargs: Any) -> Any:
        try:
            return fit(model, *args, **kwargs)
        finally:
            protocol = installed_protocol(model)
            if protocol is not None:
                protocol.leave()

    fit_then_leave._crossover_guarded = True
    model_class.fit = fit_then_leave
