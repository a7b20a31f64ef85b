"""A lease contender run as its own OS process by the lease tests and benchmark.

Modes (argv[1]):
  cycles GROUP KEY N HOLD_MS OUT [BARRIER]
                                   acquire/hold/release N times, write intervals to OUT (JSON);
                                   BARRIER (DIR:COUNT) lines contenders up before the first cycle
  hold GROUP KEY READY_FILE        acquire, touch READY_FILE, then sleep until killed
  acquire GROUP KEY TIMEOUT OUT    one acquire; write the wall time it succeeded (or the error);
                                   OUT with suffix .started is written just before it
  exit_holding GROUP KEY           acquire and exit without releasing
  join GROUP KEY JOB JOBS TIMEOUT OUT
                                   as job JOB, wait_for_jobs(JOBS, TIMEOUT); write the members
                                   seen (or the GroupIncomplete message) to OUT (JSON)
The lease directory is $CROSSOVER_LEASE_DIR (else /dev/shm), as in a deployment.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from crossover_tf.lease import DeviceLease, GroupIncomplete  # noqa: E402
from experiments.barrier import wait_at_barrier  # noqa: E402


def main(argv: list[str]) -> int:
    mode, group, key = argv[1], argv[2], argv[3]
    if mode == "join":
        return join(group, key, argv[4], int(argv[5]), float(argv[6]), pathlib.Path(argv[7]))
    lease = DeviceLease(group, key, timeout_s=float(argv[4]) if mode == "acquire" else 30.0)
    if mode == "cycles":
        n, hold_s, out = int(argv[4]), float(argv[5]) / 1000.0, argv[6]
        lease.acquire()  # warm up op construction before recording
        lease.yield_device()
        if len(argv) > 7:
            wait_at_barrier(argv[7], str(os.getpid()))
        intervals = []
        for _ in range(n):
            lease.acquire()
            start = time.time_ns()
            time.sleep(hold_s)
            end = time.time_ns()
            lease.yield_device()
            intervals.append((start, end))
        pathlib.Path(out).write_text(json.dumps(
            {"pid": os.getpid(), "intervals": intervals, "stats": lease.stats().as_dict(),
             "timeline": lease.timeline().tolist()}))
    elif mode == "hold":
        lease.acquire()
        pathlib.Path(argv[4]).write_text(str(os.getpid()))
        time.sleep(120)
    elif mode == "acquire":
        out = pathlib.Path(argv[5])
        out.with_suffix(".started").write_text(str(time.time_ns()))  # TF loaded: about to queue
        try:
            lease.acquire()
            out.write_text(json.dumps({"acquired_ns": time.time_ns(),
                                       "recoveries": lease.stats().recoveries}))
        except Exception as e:  # reported to the test, which asserts on it
            out.write_text(json.dumps({"error": type(e).__name__, "message": str(e)}))
    elif mode == "exit_holding":
        lease.acquire()
        os._exit(0)
    else:
        raise SystemExit(f"unknown mode {mode}")
    return 0


def join(group: str, key: str, job: str, jobs: int, timeout_s: float, out: pathlib.Path) -> int:
    lease = DeviceLease(group, key, job=job)
    try:
        members = lease.wait_for_jobs(jobs, timeout_s)
        result = {"path": str(lease.path), "jobs": sorted({m.job for m in members})}
        time.sleep(1.0)  # stay a member while the peers take their look
    except GroupIncomplete as e:  # reported to the test, which asserts on it
        result = {"path": str(lease.path), "error": str(e)}
    out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
