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
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
import tempfile
import time

from crossover_tf_planner.comm_cost import CommCpu, fit

MIN_RUN_S = 2.0
DEFAULT_MB = 4.0  # allreduce size when the job's own is unknown (the cost is per MB)
MAX_ALLREDUCES = 2000


class NotShaped(RuntimeError):
    """The cluster fell back to unshaped localhost: no link to measure the cost on."""


def worker(megabytes: float, seconds: float, idle_s: float, out: str) -> None:
    """One rank: timed allreduces of `megabytes`, then one allreduce whose peer arrives
    `idle_s` late; rank 0 writes the measurements to `out`."""
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
    wall0, cpu0 = time.perf_counter(), _cpu_s()
    for _ in range(count):
        allreduce(tensor).numpy()
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
            "idle_wall_s": idle_wall, "idle_cpu_s": idle_cpu}))


def measure(bandwidth_mbit: float, megabytes: float = DEFAULT_MB, seconds: float = 10.0,
            idle_s: float = 3.0, num_hosts: int = 2, timeout_s: float = 180.0,
            log_dir: str = "runs/plan/comm_cpu", cycle_time_ms: float | None = None
            ) -> CommCpu:
    """Runs the probe as one rank per host of an emulated cluster at `bandwidth_mbit`
    (with HOROVOD_CYCLE_TIME=`cycle_time_ms` when given: the cycle sets the polling cost)."""
    from experiments.cluster import EmulatedCluster
    from experiments.cluster.launch import launch_job, wait_jobs
    if seconds < MIN_RUN_S or idle_s < MIN_RUN_S / 2:
        raise ValueError(f"probe too short to measure: seconds >= {MIN_RUN_S}, idle_s >= "
                         f"{MIN_RUN_S / 2}")
    with tempfile.TemporaryDirectory() as tmp, EmulatedCluster(
            num_hosts=num_hosts, bandwidth_mbit=bandwidth_mbit) as cluster:
        if not cluster.is_emulated:
            raise NotShaped(f"the comm CPU probe needs the emulated, shaped cluster "
                            f"({cluster.fallback_reason})")
        out = pathlib.Path(tmp) / "probe.json"
        command = [sys.executable, "-m", "experiments.comm_cpu", str(megabytes), str(seconds),
                   str(idle_s), str(out)]
        env = {} if cycle_time_ms is None else {"HOROVOD_CYCLE_TIME": f"{cycle_time_ms:g}"}
        result = wait_jobs([launch_job(cluster, command, job_name="comm_cpu", env=env,
                                       log_dir=log_dir, timeout_s=timeout_s)])["comm_cpu"]
        if not result["ok"]:
            raise RuntimeError(f"comm CPU probe failed (exit codes {result['exit_codes']}, "
                               f"timed out {result['timed_out']}):\n{result['failed_log_tail']}")
        probe = json.loads(out.read_text())
    return dataclasses.replace(fit(probe), bandwidth_mbit=bandwidth_mbit)


if __name__ == "__main__":  # one probe rank (launched by measure)
    worker(float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
