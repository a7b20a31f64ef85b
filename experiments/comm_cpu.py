"""How much CPU an allreduce takes from the core its job shares with another job's compute.

On a CPU host the device is the core: while job A is in its allreduce, Gloo's reduction, the
TCP stack, Horovod's background thread (polling every HOROVOD_CYCLE_TIME) and TensorFlow's
executor still run on it, and job B's compute gets less of it. The planner's cpu device model
charges that as ``comm_cpu_s`` per step (device_models.py), from two numbers measured here on
the emulated cluster, with the same Horovod/TensorFlow ops as a training job:

* ``cpu_per_wait_s``: CPU seconds per second a rank spends blocked in an allreduce whose peer
  has not arrived yet (polling and spinning: no bytes move);
* ``cpu_s_per_mb``: CPU seconds per megabyte allreduced, beyond that polling.

so that ``comm_cpu_s = cpu_per_wait_s * M + cpu_s_per_mb * MB`` for a step whose allreduce
takes M seconds and moves MB megabytes. One run takes well under a minute:
``python -m experiments.plan --mode=calibrate`` (root, for the shaped links).

The same probe, run as two jobs at once (``measure_sharing``; ``plan.py
--mode=link_sharing``), says how two jobs' allreduces share a host's link: their combined
throughput over one job's alone (1: the link splits evenly; below 1: sharing wastes it, which a
lease over the link could win back; above 1: the fixed parts of the allreduces overlap).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import sys
import tempfile
import time
from typing import Any, Iterator, Mapping, Sequence

from crossover_tf_planner.comm_cost import CommCpu, fit

MIN_RUN_S = 2.0
DEFAULT_MB = 4.0  # allreduce size when the job's own is unknown (the cost is per MB)
MAX_ALLREDUCES = 2000


class NotShaped(RuntimeError):
    """The cluster fell back to unshaped localhost: no link to measure the cost on."""


def worker(megabytes: float, seconds: float, idle_s: float, out: str,
           start_barrier: str | None = None) -> None:
    """One rank: timed allreduces of `megabytes` (after every rank of every probe job reached
    `start_barrier`, barrier.py's DIR:COUNT, when given: so that two probe jobs overlap), then
    one allreduce whose peer arrives `idle_s` late; rank 0 writes the measurements and each
    timed allreduce's end time to `out`."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from crossover_tf.callbacks import process_cpu_s as _cpu_s  # all threads: Horovod's, Gloo's

    hvd.init()
    tensor = tf.ones([max(1, int(megabytes * 2**20 / 4))], tf.float32)
    allreduce = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum, name="comm_cpu_probe"))
    start = time.perf_counter()
    for _ in range(3):  # warm-up: graph tracing, Gloo's connections; sizes the timed run
        allreduce(tensor).numpy()
    per_allreduce = (time.perf_counter() - start) / 3
    # Every rank must run the same number of allreduces: agree on the largest count asked for.
    wanted = min(MAX_ALLREDUCES, max(5, int(seconds / per_allreduce)))
    count = int(hvd.allreduce(tf.constant(float(wanted)), op=hvd.Max, name="comm_cpu_count"))
    if start_barrier:
        from experiments.barrier import wait_at_barrier
        wait_at_barrier(start_barrier, f"rank{hvd.rank()}-pid{os.getpid()}")
    started_s, ends_s = time.time(), []
    wall0, cpu0 = time.perf_counter(), _cpu_s()
    for _ in range(count):
        allreduce(tensor).numpy()
        ends_s.append(time.time())
    wall, cpu = time.perf_counter() - wall0, _cpu_s() - cpu0
    small = tf.ones([1], tf.float32)
    allreduce(small).numpy()  # line the ranks up before the idle probe
    if hvd.rank() != 0:
        time.sleep(idle_s)
    wall1, cpu1 = time.perf_counter(), _cpu_s()
    allreduce(small).numpy()
    idle_wall, idle_cpu = time.perf_counter() - wall1, _cpu_s() - cpu1
    if hvd.rank() == 0:
        pathlib.Path(out).write_text(json.dumps({
            "megabytes": tensor.shape[0] * 4 / 2**20, "allreduces": count,
            "wall_s_per_allreduce": wall / count, "cpu_s_per_allreduce": cpu / count,
            "idle_wall_s": idle_wall, "idle_cpu_s": idle_cpu, "started_s": started_s,
            "ends_s": ends_s}))


def _run_probes(cluster: Any, names: Sequence[str], megabytes: float, seconds: float,
                idle_s: float, *, tmp: pathlib.Path, log_dir: str, timeout_s: float,
                env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Runs one probe job per name at once on `cluster` (their timed allreduces starting
    together); rank 0's measurements per job."""
    from experiments import launch_pair
    barrier = [f"{tmp / 'barrier'}:{len(names) * len(cluster.hosts)}"] if len(names) > 1 else []
    commands = {name: [sys.executable, "-m", "experiments.comm_cpu", str(megabytes),
                       str(seconds), str(idle_s), str(tmp / f"{name}.json"), *barrier]
                for name in names}
    results = launch_pair.run_jobs(cluster, commands, mode="concurrent", log_dir=log_dir,
                                   timeout_s=timeout_s, env=env)
    launch_pair.raise_on_failure(results, "comm probe")
    return {name: json.loads((tmp / f"{name}.json").read_text()) for name in names}


@contextlib.contextmanager
def _shaped_cluster(bandwidth_mbit: float, num_hosts: int) -> Iterator[Any]:
    from experiments.cluster import EmulatedCluster
    with EmulatedCluster(num_hosts=num_hosts, bandwidth_mbit=bandwidth_mbit) as cluster:
        if not cluster.is_emulated:
            raise NotShaped(f"the comm probes need the emulated, shaped cluster "
                            f"({cluster.fallback_reason})")
        yield cluster


def measure(bandwidth_mbit: float, megabytes: float = DEFAULT_MB, seconds: float = 10.0,
            idle_s: float = 3.0, num_hosts: int = 2, timeout_s: float = 180.0,
            log_dir: str = "runs/plan/comm_cpu", cycle_time_ms: float | None = None
            ) -> CommCpu:
    """Runs the probe as one rank per host of an emulated cluster at `bandwidth_mbit`
    (with HOROVOD_CYCLE_TIME=`cycle_time_ms` when given: the cycle sets the polling cost)."""
    if seconds < MIN_RUN_S or idle_s < MIN_RUN_S / 2:
        raise ValueError(f"probe too short to measure: seconds >= {MIN_RUN_S}, idle_s >= "
                         f"{MIN_RUN_S / 2}")
    env = {} if cycle_time_ms is None else {"HOROVOD_CYCLE_TIME": f"{cycle_time_ms:g}"}
    with tempfile.TemporaryDirectory() as tmp, _shaped_cluster(bandwidth_mbit, num_hosts) as c:
        probe = _run_probes(c, ["comm_cpu"], megabytes, seconds, idle_s, tmp=pathlib.Path(tmp),
                            log_dir=log_dir, timeout_s=timeout_s, env=env)["comm_cpu"]
    probe = {k: v for k, v in probe.items() if k not in ("started_s", "ends_s")}
    return dataclasses.replace(fit(probe), bandwidth_mbit=bandwidth_mbit)


def sharing(solo: Mapping[str, Any], shared: Mapping[str, Mapping[str, Any]]
            ) -> dict[str, Any]:
    """How two concurrent probe jobs shared the link, from their allreduce end times: over the
    window where both were timing, each job's seconds per allreduce, and their combined
    throughput over the solo job's (sum of solo / shared seconds per allreduce)."""
    start = max(p["started_s"] for p in shared.values())
    end = min(p["ends_s"][-1] for p in shared.values())
    per_allreduce = {}
    for name, probe in shared.items():
        inside = [t for t in probe["ends_s"] if start < t <= end]
        if len(inside) < 2:
            raise RuntimeError(f"probe {name} finished {len(inside)} allreduces while both "
                               f"jobs ran: too little overlap to measure sharing")
        per_allreduce[name] = (inside[-1] - inside[0]) / (len(inside) - 1)
    solo_s = solo["wall_s_per_allreduce"]
    return {"megabytes": solo["megabytes"], "solo_s_per_allreduce": solo_s,
            "shared_s_per_allreduce": per_allreduce, "overlap_s": end - start,
            "combined_throughput": sum(solo_s / s for s in per_allreduce.values())}


def measure_sharing(bandwidth_mbit: float, megabytes: float = DEFAULT_MB,
                    seconds: float = 15.0, num_hosts: int = 2, timeout_s: float = 300.0,
                    log_dir: str = "runs/plan/link_sharing") -> dict[str, Any]:
    """One probe job alone, then two at once from a shared start, on one emulated cluster at
    `bandwidth_mbit`: ``sharing`` of the two against the one."""
    if seconds < MIN_RUN_S:
        raise ValueError(f"probe too short to measure: seconds >= {MIN_RUN_S}")
    with tempfile.TemporaryDirectory() as tmp, _shaped_cluster(bandwidth_mbit, num_hosts) as c:
        kwargs = {"tmp": pathlib.Path(tmp), "log_dir": log_dir, "timeout_s": timeout_s,
                  "env": {}}
        solo = _run_probes(c, ["link_solo"], megabytes, seconds, MIN_RUN_S / 2,
                           **kwargs)["link_solo"]
        # Both jobs time the same stretch: each sizes its count alone, so twice the seconds.
        shared = _run_probes(c, ["link_a", "link_b"], megabytes, 2 * seconds, MIN_RUN_S / 2,
                             **kwargs)
    return {"bandwidth_mbit": bandwidth_mbit, **sharing(solo, shared)}


if __name__ == "__main__":  # one probe rank (launched by measure)
    worker(float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4],
           sys.argv[5] if len(sys.argv) > 5 else None)
