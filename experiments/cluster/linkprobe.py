"""Measures what a link between two emulated hosts really delivers (a TCP bulk transfer).

Used by tests and by experiments to record the achieved bandwidth next to the configured one.
"""
from __future__ import annotations

import subprocess
import sys
import time

from experiments.cluster.netns import EmulatedCluster, Host

# Receiver: prints its port, then "<bytes> <seconds from first to last byte>".
_RECEIVER = r"""
import socket, sys, time
srv = socket.socket(); srv.bind((sys.argv[1], 0)); srv.listen(1); srv.settimeout(float(sys.argv[2]))
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept(); conn.settimeout(float(sys.argv[2]))
total, first = 0, None
while True:
    chunk = conn.recv(1 << 16)
    if not chunk:
        break
    first = first or time.monotonic()
    total += len(chunk)
print(total, time.monotonic() - (first or time.monotonic()), flush=True)
"""
# Sender: connects (bounded retries) and sends argv[3] bytes.
_SENDER = r"""
import socket, sys, time
for attempt in range(50):
    try:
        sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5); break
    except OSError:
        time.sleep(0.1)
else:
    sys.exit("connect failed")
block, left = b"\0" * (1 << 16), int(sys.argv[3])
while left > 0:
    left -= sock.send(block[:min(left, len(block))])
sock.close()
"""


def transfer(cluster: EmulatedCluster, src: Host, dst: Host, nbytes: int,
             timeout_s: float = 30.0) -> tuple[int, float]:
    """Sends `nbytes` from `src` to `dst` over TCP; returns (bytes received, seconds taken)."""
    receiver = subprocess.Popen(
        cluster.exec_prefix(dst) + [sys.executable, "-c", _RECEIVER, dst.address, str(timeout_s)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = receiver.stdout.readline().strip()
        if not port.isdigit():
            raise RuntimeError(f"receiver on {dst.name} failed: {receiver.stderr.read()}")
        subprocess.run(cluster.exec_prefix(src) + [sys.executable, "-c", _SENDER, dst.address,
                                                   port, str(nbytes)],
                       check=True, timeout=timeout_s, capture_output=True)
        out, err = receiver.communicate(timeout=timeout_s)
        received, seconds = out.split()
        return int(received), float(seconds)
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait(timeout=5)


def measure_mbit(cluster: EmulatedCluster, src: Host, dst: Host, nbytes: int = 4 << 20,
                 timeout_s: float = 30.0) -> float:
    """Payload throughput in Mbit/s of one `nbytes` TCP transfer from `src` to `dst`."""
    started = time.monotonic()
    received, seconds = transfer(cluster, src, dst, nbytes, timeout_s)
    if received != nbytes:
        raise RuntimeError(f"received {received} of {nbytes} bytes")
    seconds = seconds if seconds > 0 else time.monotonic() - started
    return received * 8 / seconds / 1e6
