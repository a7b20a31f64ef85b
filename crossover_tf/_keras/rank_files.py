"""Where each rank's file-writing Keras callbacks write during fit: rank 0 the real files, every
other rank a temporary directory of its own, removed when fit ends, as Keras does under
MultiWorkerMirroredStrategy (its distributed_file_utils: the chief writes, workers write to
temporary places).

Why: TensorFlow's multi-worker tutorials give ModelCheckpoint, BackupAndRestore and TensorBoard
to every worker with one directory. Here every rank then wrote the same files: one rank failed
with FileExistsError while the other waited in a collective until collective_timeout_s, and
TensorBoard wrote one event file per rank into one run directory. BackupAndRestore still reads
the chief's backup on every rank when training begins, so a restarted job resumes every rank at
the same epoch; only its writes go to the rank's own place.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Any, Callable, Iterator, Sequence

import keras

_BACKUP_PATHS = ("backup_dir", "_weights_path", "_training_metadata_path", "_prev_weights_path",
                 "_prev_training_metadata_path")


@contextlib.contextmanager
def written_by_the_chief(callbacks: Sequence[Any], rank: int) -> Iterator[None]:
    """Inside, on a rank other than 0, the callbacks' files go to a scratch directory; every
    attribute changed is put back, and the directory removed, on the way out."""
    if rank == 0:
        yield
        return
    scratch = tempfile.mkdtemp(prefix=f"crossover-rank{rank}-")
    undo: list[Callable[[], None]] = []
    try:
        for callback in callbacks:
            _redirect(callback, scratch, undo)
        yield
    finally:
        for step in reversed(undo):
            step()
        shutil.rmtree(scratch, ignore_errors=True)


def _set(obj: Any, name: str, value: Any) -> Callable[[], None]:
    """Sets obj.name and returns what puts it back."""
    before = obj.__dict__.get(name, _MISSING)
    setattr(obj, name, value)

    def put_back() -> None:
        if before is _MISSING:
            obj.__dict__.pop(name, None)
        else:
            setattr(obj, name, before)
    return put_back


_MISSING = object()


def _redirect(callback: Any, scratch: str, undo: list[Callable[[], None]]) -> None:
    """Points callback's writes into scratch, adding what puts each change back to undo."""
    if isinstance(callback, keras.callbacks.ModelCheckpoint):
        undo.append(_set(callback, "filepath", os.path.join(
            scratch, "checkpoint", os.path.basename(callback.filepath))))
    elif isinstance(callback, keras.callbacks.TensorBoard):
        undo.append(_set(callback, "log_dir", os.path.join(scratch, "tensorboard")))
    elif isinstance(callback, keras.callbacks.BackupAndRestore):
        _backup_from_the_chief(callback, os.path.join(scratch, "backup"), undo)


def _backup_from_the_chief(callback: Any, own_dir: str,
                           undo: list[Callable[[], None]]) -> None:
    """Reads the chief's backup when training begins (every rank resumes at its epoch), then
    writes the rank's own backups to own_dir."""
    begin = callback.on_train_begin

    def on_train_begin(logs: Any = None) -> None:
        begin(logs)
        for name in _BACKUP_PATHS:
            path = getattr(callback, name)
            moved = own_dir if name == "backup_dir" else os.path.join(
                own_dir, os.path.basename(path))
            undo.append(_set(callback, name, moved))

    undo.append(_set(callback, "on_train_begin", on_train_begin))
