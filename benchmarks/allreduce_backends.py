"""The gradient allreduce under each communication backend, side by side in one run: Horovod's
Gloo against TensorFlow's ring over gRPC, on the emulated two-host cluster's shaped link.

Why: the tensorflow backend (issue 33) moves the same bytes between the same hosts; what it
costs in allreduce time decides whether a stock-TensorFlow user loses anything by crossing
without Horovod. Both run through the runtime's own seam (the communicator the strategy uses),
one job at a time, in alternating order each round, so drift on a shared machine falls on both.

  sudo python -m benchmarks.allreduce_backends [--mbit 100] [--mib 4] [--iterations 20]

Needs root (network namespaces). Prints each round's median per backend, the ratio
tensorflow / horovod with its spread over the rounds, and the link's own time for the bytes
a two-rank ring sends each way (the floor neither can beat).
"""
from __future__ import annotations

import argparse
import pathlib
import re
import statistics
import sys
import tempfile
import textwrap

from benchmarks.common import median_range, parse_args
from experiments.cluster.launch import launch_job, wait_jobs
from experiments.cluster.netns import EmulatedCluster

BACKENDS = ("horovod", "tensorflow")
JOB_TIMEOUT_S = 300.0

RANK_SCRIPT = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, os.environ["CROSSOVER_REPO"])
    backend = os.environ["BENCH_BACKEND"]
    if backend == "horovod":
        from crossover_tf._communication.horovod import HorovodCommunicator as Comm
    else:
        from crossover_tf._communication.tensorflow import TensorFlowCommunicator as Comm
    comm = Comm()
    comm.start()
    import tensorflow as tf
    values = tf.ones([int(float(os.environ["BENCH_MIB"]) * (1 << 20) / 4)], tf.float32)
    step = tf.function(lambda t: comm.allreduce([t], mean=True, name="bench")[0])
    for _ in range(2):  # warm-up: tracing, connections
        step(values).numpy()
    times = []
    for _ in range(int(os.environ["BENCH_ITERATIONS"])):
        start = time.perf_counter()
        step(values).numpy()
        times.append(1e3 * (time.perf_counter() - start))
    comm.barrier()
    print("TIMES_MS " + ",".join(f"{t:.3f}" for t in times), flush=True)
""")
_TIMES = re.compile(r"^TIMES_MS (\S+)$", re.M)


def run_backend(cluster: EmulatedCluster, backend: str, script: pathlib.Path,
                log_dir: pathlib.Path, mib: float, iterations: int, name: str) -> list[float]:
    """One two-rank job of `backend`; rank 0's allreduce times, in ms."""
    job = launch_job(cluster, [sys.executable, str(script)], job_name=name,
                     env={"BENCH_BACKEND": backend, "BENCH_MIB": str(mib),
                          "BENCH_ITERATIONS": str(iterations),
                          "CROSSOVER_REPO": str(pathlib.Path(__file__).resolve().parents[1])},
                     log_dir=log_dir, timeout_s=JOB_TIMEOUT_S, backend=backend)
    result = wait_jobs([job])[name]
    if not result["ok"]:
        raise RuntimeError(f"{backend} job failed (rank {result['failed_rank']}, exit "
                           f"{result['failed_exit_code']}):\n{result['failed_log_tail']}")
    match = _TIMES.search(pathlib.Path(result["logs"][0]).read_text())
    if match is None:
        raise RuntimeError(f"{backend}: no TIMES_MS line in {result['logs'][0]}")
    return [float(t) for t in match.group(1).split(",")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mbit", type=float, default=100.0, help="the link's bandwidth")
    parser.add_argument("--mib", type=float, default=4.0, help="the tensor allreduced")
    parser.add_argument("--iterations", type=int, default=20, help="timed allreduces a job")
    parser.add_argument("--rounds", type=int, default=3, help="both backends once per round")
    # --short: 2 MiB, so that the token bucket's burst (64 KiB at this rate, experiments/cluster/
    # shaping.py) is 3% of a transfer; at 0.5 MiB it was 12%, and a full bucket on each end let
    # one fresh-clone run's Horovod allreduce finish in 7.2 ms against the link's 10.5.
    args = parse_args(parser, {"mbit": 400.0, "mib": 2.0, "iterations": 3, "rounds": 1},
                      argv)
    link_ms = 1e3 * args.mib * 8 * (1 << 20) / 1e6 / args.mbit  # 2 ranks: all bytes each way
    print(f"allreduce of {args.mib:g} MiB float32 between 2 emulated hosts at "
          f"{args.mbit:g} Mbit/s, {args.iterations} timed per job; the link alone: "
          f"{link_ms:.1f} ms")
    ratios = []
    with tempfile.TemporaryDirectory(prefix="allreduce_backends.") as work, \
            EmulatedCluster(num_hosts=2, bandwidth_mbit=args.mbit) as cluster:
        script = pathlib.Path(work, "rank.py")
        script.write_text(RANK_SCRIPT)
        for r in range(args.rounds):
            order = BACKENDS if r % 2 == 0 else BACKENDS[::-1]
            medians = {b: statistics.median(run_backend(
                cluster, b, script, pathlib.Path(work, "logs"), args.mib, args.iterations,
                f"{b}{r}")) for b in order}
            ratios.append(medians["tensorflow"] / medians["horovod"])
            print(f"round {r}: horovod median {medians['horovod']:.1f} ms, tensorflow median "
                  f"{medians['tensorflow']:.1f} ms, tensorflow / horovod {ratios[-1]:.3f}",
                  flush=True)
    print(f"tensorflow / horovod allreduce time over {args.rounds} round(s), median "
          f"[min–max]: {median_range(ratios, 3)}")


if __name__ == "__main__":
    main()
