"""What the test helpers that start real daemons (Slurm, Prometheus) share."""
from __future__ import annotations

import pathlib
import signal
import subprocess
from typing import TypeVar

from crossover_tf.launch import free_ports

S = TypeVar("S", bound="StartStopContext")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (a daemon may still race for
    it; callers that start one retry or fail clearly)."""
    return free_ports("127.0.0.1", 1)[0]


def log_tail(path: pathlib.Path, lines: int = 15) -> str:
    """The last lines of a daemon's log, for an error message (or why it could not be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"({path}: {e})"


def terminate(proc: subprocess.Popen, timeout_s: float) -> None:
    """Stops a daemon the test started: SIGTERM, then SIGKILL if it is still there after
    timeout_s (a daemon must not outlive its test, nor hang it)."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)


class StartStopContext:
    """`with Service(...) as s:` starts it and always stops it, even when start fails half-way
    (daemons it did start must not outlive the test). start() and stop() are the subclass's;
    stop() must be safe to call on a service that never fully started."""

    def start(self) -> object:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: S) -> S:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
