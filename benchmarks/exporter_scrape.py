"""One node-exporter scrape of a lease directory swamped with forged leases: its wall time, its
peak memory and how many samples it served (issue 48, item 5).

  python -m benchmarks.exporter_scrape [--leases 1000] [--members 63]

Anyone who passes the lease's trust rule (the segment's user, or in group mode any member of
the directory's group; an observer accepts any user's 0600 file) can make a file that reads as
a lease with up to 64 live members: a real segment's bytes with its slots' nonces filled in,
and one process holding each slot's lock byte (ops/core/lease_liveness.h: kSlotLockBase + i).
This builds --leases such files with --members live members each, as that attacker would (one
process, this one, holds every lock), and times one scrape as Prometheus would take it: the
collector reads the directory, prometheus_client renders the text. Before the series bound
1,000 x 63 took 13.6 s for 1,138,004 samples, a 730 MB tracemalloc peak and a 776 MB rise in
peak RSS (the issue's exporter: 10.4 s, 207 MB), past Prometheus's 10 s scrape timeout; with
it 0.40 s for 13,222 samples, 8.6 MB and 10.3 MB (2 shared cores).

Memory is tracemalloc's peak over the scrape (Python's allocations; the observer library's
few KiB per file are freed at once) and the rise in the process's peak RSS (ru_maxrss), taken
over the first scrape (the imports come before it); tracemalloc's peak is taken over a
second scrape, since tracing slows the first one's timing.
"""
from __future__ import annotations

import argparse
import ctypes
import fcntl
import os
import pathlib
import resource
import subprocess
import tempfile
import time
import tracemalloc
import uuid
from typing import Iterator

from benchmarks.common import parse_args

REPO = pathlib.Path(__file__).resolve().parent.parent
LEASE_CLI = REPO / "ops" / "build" / "lease_cli"
SLOT_LOCK_BASE = 1 << 20  # ops/core/lease_liveness.h kSlotLockBase: slot i's lock byte
JOB_OFFSET = 24  # Slot.job after nonce (8), pid (4, padded to 8) and pid_ns (8)
SHORT = {"leases": 50, "members": 63}


class _Flock(ctypes.Structure):
    _fields_ = [("l_type", ctypes.c_short), ("l_whence", ctypes.c_short),
                ("l_start", ctypes.c_int64), ("l_len", ctypes.c_int64), ("l_pid", ctypes.c_int)]


def _wait_for(path: pathlib.Path, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not within {timeout} s")
        time.sleep(0.02)


def forge_template(scratch: pathlib.Path,
                   lease_cli: pathlib.Path = LEASE_CLI) -> tuple[bytes, int, int]:
    """(a real segment's bytes, the offset of slot 0, the slot stride): two lease_cli members
    (a holder and a queued waiter) with known job labels make a real segment; the labels'
    offsets give where the slots lie without reading the C++ layout."""
    if not lease_cli.exists():
        subprocess.run(["make", "-s", "-C", str(REPO / "ops"), "tests"], check=True, timeout=300)
    leases = scratch / "template"
    leases.mkdir(mode=0o700)
    group = f"forge{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "CROSSOVER_LEASE_DIR": str(leases)}
    jobs = [f"forgejob{uuid.uuid4().hex[:16]}" for _ in range(2)]
    procs = [subprocess.Popen([str(lease_cli), "hold", group, "dev", str(scratch / "held")],
                              env={**env, "CROSSOVER_LEASE_JOB": jobs[0]})]
    try:
        _wait_for(scratch / "held", "the template's holder")
        procs.append(subprocess.Popen([str(lease_cli), "acquire", group, "dev", "60",
                                       str(scratch / "acquired")],
                                      env={**env, "CROSSOVER_LEASE_JOB": jobs[1]}))
        segment = leases / f"crossover.{group}.dev"
        deadline = time.monotonic() + 30
        while True:
            data = segment.read_bytes()
            if all(job.encode() in data for job in jobs):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the template's second member did not join within 30 s")
            time.sleep(0.02)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    first, second = sorted(data.index(job.encode()) for job in jobs)
    return data, first - JOB_OFFSET, second - first


def forged_segment(template: tuple[bytes, int, int], members: int, tag: int) -> bytes:
    """The template with slots 0..members-1 each a member of its own (nonce, pid, job)."""
    data, slot0, stride = template
    out = bytearray(data)
    model = data[slot0:slot0 + stride]
    for i in range(members):
        slot = bytearray(model)
        slot[0:8] = (0x5EED0000_00000000 + tag * 64 + i + 1).to_bytes(8, "little")
        slot[8:12] = (100000 + tag * 64 + i).to_bytes(4, "little")
        job = f"forged{tag}-{i}".encode()
        slot[JOB_OFFSET:stride] = job + bytes(stride - JOB_OFFSET - len(job))
        out[slot0 + i * stride:slot0 + (i + 1) * stride] = slot
    return bytes(out)


def lock_slots(fd: int, members: int) -> None:
    """Holds slot 0..members-1's lock bytes through fd (an open file description lock: held
    while fd is open, seen by every other open of the file, this process's included)."""
    for i in range(members):
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, bytes(_Flock(fcntl.F_WRLCK, os.SEEK_SET,
                                                       SLOT_LOCK_BASE + i, 1, 0)))


def plant_forged_leases(directory: pathlib.Path, template: tuple[bytes, int, int], count: int,
                        members: int, prefix: str = "forged") -> list[int]:
    """count 0600 files crossover.<prefix>NNNN.dev, each with members live members; returns the
    fds that keep them live (close them to end the members)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < count + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 256), hard))
    fds = []
    for i in range(count):
        path = directory / f"crossover.{prefix}{i:04d}.dev"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fds.append(fd)
        os.write(fd, forged_segment(template, members, i))
        lock_slots(fd, members)
    return fds


def count_samples(text: bytes) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))


def scrape_once(lease_dir: pathlib.Path, trace: bool) -> tuple[float, int, int, int]:
    """(seconds, tracemalloc peak bytes or 0, peak-RSS rise in bytes, samples) of one scrape:
    the collector's read of the directory and prometheus_client's text."""
    from prometheus_client import CollectorRegistry, generate_latest
    from crossover_tf.node.exporter import LeaseCollector
    registry = CollectorRegistry()
    registry.register(LeaseCollector(lease_dir))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if trace:
        tracemalloc.start()
    start = time.perf_counter()
    text = generate_latest(registry)
    took = time.perf_counter() - start
    peak = 0
    if trace:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    rss_rise = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) * 1024
    return took, peak, rss_rise, count_samples(text)


def measure(leases: int, members: int) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        scratch = pathlib.Path(tmp)
        template = forge_template(scratch)
        directory = scratch / "leases"
        directory.mkdir(mode=0o700)
        start = time.perf_counter()
        fds = plant_forged_leases(directory, template, leases, members)
        yield (f"planted {leases} leases x {members} live members in "
               f"{time.perf_counter() - start:.1f} s")
        try:
            took, _, rss_rise, samples = scrape_once(directory, trace=False)
            yield (f"scrape 1: {took:.3f} s, {samples} samples, peak RSS rise "
                   f"{rss_rise / 2**20:.1f} MB")
            traced, peak, _, _ = scrape_once(directory, trace=True)
            yield (f"scrape 2 (traced): {traced:.3f} s, tracemalloc peak "
                   f"{peak / 2**20:.1f} MB")
            yield (f"result: one scrape {took:.3f} s, peak {peak / 2**20:.1f} MB, "
                   f"{samples} samples")
        finally:
            for fd in fds:
                os.close(fd)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--leases", type=int, default=1000, help="forged lease files")
    parser.add_argument("--members", type=int, default=63, help="live members in each (<= 64)")
    args = parse_args(parser, SHORT, argv)
    for line in measure(args.leases, args.members):
        print(line, flush=True)


if __name__ == "__main__":
    main()
