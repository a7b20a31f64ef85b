"""Runs registered teardown callbacks on normal exit, on SIGINT/SIGTERM/SIGHUP, and via atexit.

A `with` block alone is not enough: SIGTERM's default action kills Python without unwinding, and
an exception in a signal handler can land in the middle of another cleanup. Callbacks must be
idempotent because they may run from more than one of these paths.
"""
from __future__ import annotations

import atexit
import itertools
import signal
import threading
from typing import Callable

from absl import logging

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_callbacks: dict[int, Callable[[], None]] = {}
_ids = itertools.count()
_lock = threading.RLock()
_atexit_installed = False
_previous: dict[int, object] = {}


def register(callback: Callable[[], None]) -> int:
    """Adds a teardown callback; returns a token for `unregister`."""
    with _lock:
        _install_once()
        token = next(_ids)
        _callbacks[token] = callback
        return token


def unregister(token: int) -> None:
    with _lock:
        _callbacks.pop(token, None)


def run_all() -> None:
    """Runs (and forgets) every registered callback, newest first; one failure does not stop
    the rest."""
    with _lock:
        pending = sorted(_callbacks.items(), reverse=True)
        _callbacks.clear()
    for _, callback in pending:
        try:
            callback()
        except Exception:  # teardown must go on: log and continue
            logging.exception("crossover_tf cluster teardown callback failed")


def _on_signal(signum: int, frame) -> None:
    run_all()
    previous = _previous.get(signum)
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:
        raise SystemExit(128 + signum)


def _install_once() -> None:
    """Hooks atexit once and the signals once (signals only from the main thread, as Python
    requires)."""
    global _atexit_installed
    if not _atexit_installed:
        _atexit_installed = True
        atexit.register(run_all)
    if _previous:
        return
    if threading.current_thread() is not threading.main_thread():
        logging.warning("cluster created off the main thread: signal cleanup not installed yet")
        return
    for signum in _SIGNALS:
        _previous[signum] = signal.getsignal(signum)
        signal.signal(signum, _on_signal)
