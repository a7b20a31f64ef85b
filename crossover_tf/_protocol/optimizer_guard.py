"""Every Keras optimizer update of a multi-rank job's variables applies gradients reduced over
the job's ranks, or is refused.

Inside strategy.run the optimizer sums them itself, through the run's replica context
(replica_context), as MultiWorkerMirroredStrategy's does; the update is marked as the
gradients' reduction, so it goes through the step protocol (the link turn, the device yielded).
Outside run, an update of variables made in a multi-rank job's scope() is refused unless the
step reduced its gradients (strategy.gradient_tape, synchronize_gradients, the Keras step:
gradient_sync), naming the fixes: otherwise each rank would train alone, silently.
"""
from __future__ import annotations

import functools
from typing import Any

import keras

from crossover_tf._protocol import gradient_sync, ownership, replica_context

_GUARDED = "_crossover_guarded"


def guard_optimizers(optimizer_class: type = keras.optimizers.Optimizer) -> None:
    """Wraps optimizer_class.apply (apply_gradients calls it) once per process."""
    apply = optimizer_class.apply
    if getattr(apply, _GUARDED, False):
        return

    @functools.wraps(apply)
    def guarded_apply(optimizer: Any, grads: Any, trainable_variables: Any = None) -> Any:
        check_update(optimizer, trainable_variables)
        run = replica_context.current()
        if run is None:
            return apply(optimizer, grads, trainable_variables)
        with run.reducing_gradients():
            return apply(optimizer, grads, trainable_variables)

    setattr(guarded_apply, _GUARDED, True)
    optimizer_class.apply = guarded_apply


def check_update(optimizer: Any, trainable_variables: Any) -> None:
    """Raises unless this update may go ahead (see the module docstring)."""
    if replica_context.current() is not None:
        return
    variables = (trainable_variables if trainable_variables is not None
                 else getattr(optimizer, "_trainable_variables", None) or [])
    owner = ownership.owner_of_variables(variables)
    if owner is None or owner.comm.size == 1 or gradient_sync.synchronized_here(owner):
        return
    raise ValueError(
        f"crossover_tf: optimizer.apply_gradients updates variables made in the scope of a "
        f"job of {owner.comm.size} ranks with gradients that were not reduced over them: each "
        "rank would train alone. Reduce them first: wrap the tape with "
        "strategy.gradient_tape(tape) (inside strategy.hold_device()), or call "
        "strategy.synchronize_gradients(grads); or run the step with strategy.run(step_fn), "
        "where the optimizer sums them over the ranks as under MultiWorkerMirroredStrategy")


def refuse_inside_run(what: str) -> None:
    """The crossover_tf reductions that must not run inside strategy.run: there the optimizer
    sums the gradients itself, so reducing them first would reduce them twice."""
    if replica_context.current() is not None:
        raise ValueError(
            f"crossover_tf: {what} inside strategy.run: there the optimizer sums the "
            "gradients over the ranks itself, as MultiWorkerMirroredStrategy's does, so they "
            "would be reduced twice. Inside strategy.run use a plain tf.GradientTape (and "
            "tf.nn.compute_average_loss for the loss); or drop strategy.run and use "
            "strategy.gradient_tape(tape) inside strategy.hold_device()")
