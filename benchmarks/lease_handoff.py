"""Device-lease latency: hand-off between two processes, and the cost of an uncontended
acquire/release pair inside a tf.function (what a lone job pays per lease op pair).

  python -m benchmarks.lease_handoff [--rounds 5] [--cycles 400] [--hold_ms 2] [--scrape_hz 10]

Hand-off latency is measured from the timelines of two contending processes (same host, same
wall clock): the time from one process releasing to the waiting peer holding the lease. Its
tail is the machine's more than the lease's (one machine gave a p99 of 85-108 us in quiet
runs and 2.8-5.4 ms in a burst of runs), so it runs several rounds, each a fresh pair of
processes, and prints each round's median and p99 and their spread over the rounds.

With --scrape_hz H, each round runs twice side by side, without and then with the node exporter
(python -m crossover_tf.lease exporter) serving the lease directory and scraped H times a second
(Prometheus's default is once every 15 s), and it prints the ratio of the two: what scraping
costs the jobs.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from typing import Iterator, Sequence

import numpy as np

from benchmarks.common import median_range, parse_args
from crossover_tf.lease.segments import remove_group_segments

REPO = pathlib.Path(__file__).resolve().parent.parent
WORKER = REPO / "tests" / "workers" / "lease_worker.py"
# Seconds, not minutes: two rounds (a spread, if a poor one), each a short burst of hand-offs;
# each round's pair of processes loading TensorFlow is most of its time.
SHORT = {"rounds": 2, "cycles": 40, "hold_ms": 1.0, "iterations": 2000}
EXPORTER_START_S = 60  # the exporter prints its "serving" line within this


@contextlib.contextmanager
def scraped(hz: float) -> Iterator[list[int]]:
    """The node exporter on a free loopback port, scraped hz times a second from a thread of
    this process until the block ends; yields [scrapes done] (empty if hz is 0)."""
    if hz <= 0:
        yield []
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "crossover_tf.lease", "exporter", "--port",
                             str(port), "--address", "127.0.0.1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done, stop, failed = [0], threading.Event(), []

    def scrape() -> None:
        while not stop.wait(1 / hz):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=10) as r:
                    r.read()
            except OSError as err:  # the scraped rounds would silently become plain ones
                failed.append(err)
                return
            done[0] += 1

    thread = threading.Thread(target=scrape, daemon=True)
    try:
        timer = threading.Timer(EXPORTER_START_S, proc.kill)
        timer.start()
        line = proc.stdout.readline()
        timer.cancel()
        if "serving" not in line:
            raise RuntimeError(f"the exporter did not start: {line}{proc.stdout.read()[-2000:]}")
        thread.start()
        yield done
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(timeout=30)
        proc.kill()
        proc.wait()
    if failed:
        raise RuntimeError(f"scraping the exporter failed after {done[0]} scrapes: {failed[0]}")


def handoff_latencies(cycles: int, hold_ms: float) -> np.ndarray:
    """Seconds from a release to the waiting peer's acquisition, over all such hand-offs."""
    group = f"bench{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    with tempfile.TemporaryDirectory() as tmp:
        outs = [pathlib.Path(tmp) / f"{i}.json" for i in range(2)]
        barrier = f"{tmp}/barrier:2"
        procs = [subprocess.Popen([sys.executable, str(WORKER), "cycles", group, "cpu0",
                                   str(cycles), str(hold_ms), str(o), barrier], env=env)
                 for o in outs]
        for p in procs:
            if p.wait(timeout=600) != 0:
                raise RuntimeError("lease worker failed")
        timelines = [np.asarray(json.loads(o.read_text())["timeline"]) for o in outs]
    remove_group_segments([group])
    events = sorted((row[0], row[1], row[2], who) for who, t in enumerate(timelines)
                    for row in t)
    latencies = [nxt[1] - cur[2] for cur, nxt in zip(events, events[1:])
                 if nxt[3] != cur[3] and nxt[0] < cur[2]]   # peer was already waiting
    if not latencies:  # two contenders that never wait on each other: not a lease
        raise RuntimeError(f"no hand-off in {cycles} cycles of two processes")
    return np.asarray(latencies, dtype=np.float64) / 1e9


def uncontended_pair_cost(iterations: int) -> tuple[float, float]:
    """(seconds per acquire+release pair, seconds per identity pair) inside one tf.function."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from crossover_tf.lease import DeviceLease
    lease = DeviceLease(f"bench{uuid.uuid4().hex[:8]}", "cpu0")

    @tf.function
    def with_lease(x):
        for _ in tf.range(iterations):
            x = lease.yield_device(lease.acquire(x))
        return x

    @tf.function
    def baseline(x):
        for _ in tf.range(iterations):
            x = tf.identity(tf.identity(x))
        return x

    x = tf.zeros([4])
    timings = {}
    for name, fn in (("lease", with_lease), ("identity", baseline)):
        fn(x)  # trace
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            fn(x).numpy()
            best = min(best, time.perf_counter() - start)
        timings[name] = best / iterations
    lease.yield_device()
    remove_group_segments([lease.group])
    return timings["lease"], timings["identity"]


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=400)
    parser.add_argument("--hold_ms", type=float, default=2.0)
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--scrape_hz", type=float, default=0.0,
                        help="also run each round with the node exporter scraped this often")
    return parse_args(parser, SHORT, argv)


def report_rounds(rounds: list[np.ndarray]) -> None:
    """Each round's hand-offs, then the spread of the rounds' medians and p99s in us: how
    noisy the machine was while they ran."""
    medians, p99s = [], []
    for i, lat in enumerate(rounds, 1):
        us = lat * 1e6
        medians.append(float(np.median(us)))
        p99s.append(float(np.percentile(us, 99)))
        print(f"round {i}: {len(us)} hand-offs, median {medians[-1]:.1f} us, "
              f"p99 {p99s[-1]:.1f} us, max {us.max():.1f} us")
    print(f"hand-off latency over {len(rounds)} rounds, median [min–max]: "
          f"median {median_range(medians, 1)} us, p99 {median_range(p99s, 1)} us "
          f"(p99 spread: max/min {max(p99s) / min(p99s):.2f})")


def report_scraping(plain: list[np.ndarray], scraped_rounds: list[np.ndarray],
                    scrapes: int, hz: float) -> None:
    """The scraped rounds, and each pair of rounds' ratio (scraped / plain) of median and p99."""
    print(f"with the exporter scraped at {hz:g} Hz ({scrapes} scrapes):")
    report_rounds(scraped_rounds)
    medians = [float(np.median(s) / np.median(p)) for p, s in zip(plain, scraped_rounds)]
    p99s = [float(np.percentile(s, 99) / np.percentile(p, 99))
            for p, s in zip(plain, scraped_rounds)]
    print(f"scraped / not scraped, per pair of rounds, median [min–max]: median "
          f"{median_range(medians, 3)}, p99 {median_range(p99s, 3)}")


def main(argv: Sequence[str] | None = None) -> None:
    args = arguments(argv)
    rounds, scraped_rounds, scrapes = [], [], 0
    for _ in range(args.rounds):
        rounds.append(handoff_latencies(args.cycles, args.hold_ms))
        if args.scrape_hz > 0:
            with scraped(args.scrape_hz) as done:
                scraped_rounds.append(handoff_latencies(args.cycles, args.hold_ms))
            scrapes += done[0]
    pair, identity = uncontended_pair_cost(args.iterations)
    report_rounds(rounds)
    if scraped_rounds:
        report_scraping(rounds, scraped_rounds, scrapes, args.scrape_hz)
    print(f"uncontended acquire+release pair in a tf.function: {pair * 1e6:.2f} us "
          f"(two identity ops: {identity * 1e6:.2f} us; "
          f"lease adds {(pair - identity) * 1e6:.2f} us)")


if __name__ == "__main__":
    main()
