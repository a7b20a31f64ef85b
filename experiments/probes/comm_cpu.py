"""How much CPU an allreduce takes from the core its job shares with another job's compute.

On a CPU host the device is the core: while job A is in its allreduce, Gloo's reduction, the
TCP stack, Horovod's background thread (polling every HOROVOD_CYCLE_TIME) and TensorFlow's
executor still run on it, and job B's compute gets less of it. The planner's cpu device model
charges that as ``comm_cpu_s`` per step (device_models.py), from two numbers measured here on
the emulated cluster, with the same Horovod/TensorFlow ops as a training job:

* ``cpu_per_wait_s``: CPU seconds per second a rank spends blocked in an allreduce whose peer
  has not arrived yet (polling and spinning: no bytes move);
* ``cpu_s_per_mb``: CPU seconds per megabyte allreduced, beyond that polling, including the
  kernel's softirq time on the rank's core meanwhile (``core_softirq_s``: the shaped link's
  packets are processed there, on no process's account).

so that ``comm_cpu_s = cpu_per_wait_s * M + cpu_s_per_mb * MB`` for a step whose allreduce
takes M seconds and moves MB megabytes. One short run:
``python -m experiments.probes --mode=calibrate`` (root, for the shaped links).

The same probe, run as two jobs at once (``measure_sharing``; ``probes
--mode=link_sharing``), says how two jobs' allreduces share a host's link: their combined
throughput over one job's alone (1: the link splits evenly; below 1: sharing wastes it, which a
lease over the link could win back; above 1: the fixed parts of the allreduces overlap).

``measure_contention`` (``probes --mode=contention``, and every comparison's regime) gives the
planner's ``LinkContention`` in three short runs: one job whose allreduces are separated by
random gaps (the solo time), the same with a busy loop on each host's core (the compute
slowdown), and two such jobs at once, so that their allreduces overlap at random as those of
jobs that nothing coordinates do (the shared efficiency). Started together and run back to
back, two jobs can share the link well (``measure_sharing``) and still lose to allreduces
that overlap at random: that loss is what the planner needs for naive co-location and plain
crossing (measured figures: README and docs/measured_history.md).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any, Iterator, Mapping, Sequence

from crossover_tf_planner.comm_cost import CommCpu, LinkContention, fit, fit_contention
from experiments.analysis.throughput import fractional_steps
from experiments.probes.busy_loops import busy_loops

MIN_RUN_S = 2.0
DEFAULT_MB = 4.0  # allreduce size when the job's own is unknown (the cost is per MB)
MAX_ALLREDUCES = 2000
MIN_OVERLAP_ALLREDUCES = 3  # sharing needs the two jobs together for this many solo allreduces
BACKEND_ENV = "CROSSOVER_PROBE_BACKEND"  # the probe ranks' communication backend


class NotShaped(RuntimeError):
    """The cluster fell back to unshaped localhost: no link to measure the cost on."""


def worker(megabytes: float, seconds: float, idle_s: float, out: str,
           start_barrier: str | None = None, random_gaps: bool = False,
           busy_core: bool = False, gap_s: float | None = None) -> None:
    """One rank: timed allreduces of `megabytes` (after every rank of every probe job reached
    `start_barrier`, barrier.py's DIR:COUNT, when given: so that two probe jobs overlap), then
    one allreduce whose peer arrives `idle_s` late; rank 0 writes the measurements and each
    timed allreduce's span to `out`. `random_gaps`: a gap drawn uniformly from [0, 2 x the
    allreduce time] after each allreduce (the same draws on every rank of the job, others in
    another job); `gap_s`: the allreduce time those gaps and the run's length are sized by
    (default: this job's own, from its warm-up; give two jobs the same one and they run the
    same number of allreduces over the same stretch); `busy_core`: a busy loop shares the
    rank's core while it times. The allreduces go through the runtime's communicator, of the
    backend in $CROSSOVER_PROBE_BACKEND (horovod by default), as a training job's do."""
    from crossover_tf._communication import communicator_for
    from crossover_tf.options import CommunicationOptions
    from crossover_tf.profiling import process_cpu_s as _cpu_s  # all threads: the backend's too

    comm = communicator_for(CommunicationOptions(
        backend=os.environ.get(BACKEND_ENV, "horovod")))
    comm.start()
    import tensorflow as tf
    tensor = tf.ones([max(1, int(megabytes * 2**20 / 4))], tf.float32)
    allreduce = tf.function(
        lambda t: comm.allreduce([t], mean=False, name="comm_cpu_probe")[0])
    warm_up_s = []
    for _ in range(3):  # warm-up: graph tracing, Gloo's connections; sizes the timed run
        start = time.perf_counter()
        allreduce(tensor).numpy()
        warm_up_s.append(time.perf_counter() - start)
    # Every rank must run the same allreduces: agree on the slowest rank's allreduce time
    # once traced and connected (the first warm-up does both).
    per_allreduce = max(comm.gather(min(warm_up_s[1:])))
    sized_by = gap_s or per_allreduce
    gaps = _gaps(sized_by if random_gaps else 0.0, seconds, sized_by)
    if start_barrier:
        from experiments.barrier import wait_at_barrier
        wait_at_barrier(start_barrier, f"rank{comm.rank}-pid{os.getpid()}")
    spans_s = []
    # The compute of a co-located job, without TensorFlow: a spinner on this rank's core (it
    # inherits the host's CPU affinity) in the rank's own session.
    with busy_loops(1 if busy_core else 0):
        wall0, cpu0, softirq0 = time.perf_counter(), _cpu_s(), core_softirq_s()
        for gap in gaps:
            begin = time.time()
            allreduce(tensor).numpy()
            spans_s.append((begin, time.time()))
            time.sleep(gap)
        wall, cpu = time.perf_counter() - wall0, _cpu_s() - cpu0
        softirq = core_softirq_s() - softirq0
    count = len(gaps)
    wall -= sum(gaps)
    small = tf.ones([1], tf.float32)
    allreduce(small).numpy()  # line the ranks up before the idle probe
    if comm.rank != 0:
        time.sleep(idle_s)
    wall1, cpu1 = time.perf_counter(), _cpu_s()
    allreduce(small).numpy()
    idle_wall, idle_cpu = time.perf_counter() - wall1, _cpu_s() - cpu1
    if comm.rank == 0:
        pathlib.Path(out).write_text(json.dumps({
            "megabytes": tensor.shape[0] * 4 / 2**20, "allreduces": count,
            "wall_s_per_allreduce": wall / count, "cpu_s_per_allreduce": cpu / count,
            "softirq_s_per_allreduce": softirq / count,
            "idle_wall_s": idle_wall, "idle_cpu_s": idle_cpu, "spans_s": spans_s}))


def core_softirq_s(stat: str = "/proc/stat") -> float:
    """Softirq seconds so far on the cores this process may run on (its host's), from the
    kernel's per-CPU counters: where the link's packets are processed. Sampled at the tick
    (CONFIG_IRQ_TIME_ACCOUNTING is off here), so read it over a run of many allreduces."""
    cores = os.sched_getaffinity(0)
    ticks = 0
    with open(stat) as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
                ticks += int(fields[6])  # user nice system idle iowait irq softirq ...
    return ticks / os.sysconf("SC_CLK_TCK")


def _gaps(mean_gap_s: float, seconds: float, per_allreduce_s: float) -> list[float]:
    """The pause after each timed allreduce: uniform on [0, 2 x mean_gap_s] (0: back to back),
    drawn from a seed of the job's name so that its ranks agree and two jobs differ; as many as
    fill `seconds` (at least 5, at most MAX_ALLREDUCES)."""
    import random
    import zlib
    count = min(MAX_ALLREDUCES, max(5, int(seconds / (per_allreduce_s + mean_gap_s))))
    draw = random.Random(zlib.crc32(os.environ.get("CROSSOVER_JOB", "probe").encode()))
    return [draw.uniform(0.0, 2 * mean_gap_s) for _ in range(count)]


def _run_probes(cluster: Any, names: Sequence[str], megabytes: float, seconds: float,
                idle_s: float, *, tmp: pathlib.Path, log_dir: str, timeout_s: float,
                env: Mapping[str, str], random_gaps: bool = False, busy_core: bool = False,
                gap_s: float | None = None, backend: str = "horovod"
                ) -> dict[str, dict[str, Any]]:
    """Runs one probe job per name at once on `cluster` (their timed allreduces starting
    together); rank 0's measurements per job (worker's `random_gaps`, `busy_core` and
    `gap_s`)."""
    from experiments import launch_pair
    barrier = f"{tmp / 'barrier'}:{len(names) * len(cluster.hosts)}" if len(names) > 1 else ""
    commands = {name: [sys.executable, "-m", "experiments.probes.comm_cpu", str(megabytes),
                       str(seconds), str(idle_s), str(tmp / f"{name}.json"), barrier,
                       str(int(random_gaps)), str(int(busy_core)),
                       "" if gap_s is None else repr(gap_s)]
                for name in names}
    results = launch_pair.run_jobs(cluster, commands, mode="concurrent", log_dir=log_dir,
                                   timeout_s=timeout_s, env={**env, BACKEND_ENV: backend},
                                   backend=backend)
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
            log_dir: str = "runs/plan/comm_cpu", cycle_time_ms: float | None = None,
            backend: str = "horovod") -> CommCpu:
    """Runs the probe as one rank per host of an emulated cluster at `bandwidth_mbit`
    (with HOROVOD_CYCLE_TIME=`cycle_time_ms` when given, else the cluster's, as the
    comparison's jobs run: the cycle sets the polling cost)."""
    if seconds < MIN_RUN_S or idle_s < MIN_RUN_S / 2:
        raise ValueError(f"probe too short to measure: seconds >= {MIN_RUN_S}, idle_s >= "
                         f"{MIN_RUN_S / 2}")
    env = {} if cycle_time_ms is None else {"HOROVOD_CYCLE_TIME": f"{cycle_time_ms:g}"}
    with tempfile.TemporaryDirectory() as tmp, _shaped_cluster(bandwidth_mbit, num_hosts) as c:
        probe = _run_probes(c, ["comm_cpu"], megabytes, seconds, idle_s, tmp=pathlib.Path(tmp),
                            log_dir=log_dir, timeout_s=timeout_s, env=env,
                            backend=backend)["comm_cpu"]
    probe = {k: v for k, v in probe.items() if k != "spans_s"}
    return dataclasses.replace(fit(probe), bandwidth_mbit=bandwidth_mbit)


def sharing(solo: Mapping[str, Any], shared: Mapping[str, Mapping[str, Any]]
            ) -> dict[str, Any]:
    """How two concurrent probe jobs shared the link, from their allreduces' (start, end)
    spans: over the window where both were timing, each job's seconds per allreduce (the
    window over the allreduces it moved in it, those its edges cut counted by their fraction,
    as throughput.fractional_steps counts steps), and their combined throughput over the solo
    job's (sum of solo / shared seconds per allreduce). Fractions, not whole allreduces: a
    link that TCP shares unfairly lets one job finish a single allreduce in the window, and
    that is a measurement, not an error."""
    start = max(p["spans_s"][0][0] for p in shared.values())
    end = min(p["spans_s"][-1][1] for p in shared.values())
    solo_s = solo["wall_s_per_allreduce"]
    if end - start < MIN_OVERLAP_ALLREDUCES * solo_s:
        raise RuntimeError(f"the jobs ran together for {max(0.0, end - start):.2f} s, under "
                           f"{MIN_OVERLAP_ALLREDUCES} solo allreduces ({solo_s:.2f} s each): "
                           f"too little overlap to measure sharing")
    per_allreduce = {name: (end - start) / _allreduces_within(probe["spans_s"], start, end)
                     for name, probe in shared.items()}
    return {"megabytes": solo["megabytes"], "solo_s_per_allreduce": solo_s,
            "shared_s_per_allreduce": per_allreduce, "overlap_s": end - start,
            "combined_throughput": sum(solo_s / s for s in per_allreduce.values())}


def _allreduces_within(spans_s: Sequence[Sequence[float]], start: float, end: float) -> float:
    """How many allreduces the spans moved between start and end: progress runs from the
    first allreduce's start through each one's end, as a job's steps run from end to end."""
    return fractional_steps([spans_s[0][0]] + [e for _, e in spans_s], start, end)


def measure_sharing(bandwidth_mbit: float, megabytes: float = DEFAULT_MB,
                    seconds: float = 15.0, num_hosts: int = 2, timeout_s: float = 300.0,
                    log_dir: str = "runs/plan/link_sharing", backend: str = "horovod"
                    ) -> dict[str, Any]:
    """One probe job alone, then two at once from a shared start, on one emulated cluster at
    `bandwidth_mbit`: ``sharing`` of the two against the one."""
    if seconds < MIN_RUN_S:
        raise ValueError(f"probe too short to measure: seconds >= {MIN_RUN_S}")
    with tempfile.TemporaryDirectory() as tmp, _shaped_cluster(bandwidth_mbit, num_hosts) as c:
        kwargs = {"tmp": pathlib.Path(tmp), "log_dir": log_dir, "timeout_s": timeout_s,
                  "env": {}, "backend": backend}
        solo = _run_probes(c, ["link_solo"], megabytes, seconds, MIN_RUN_S / 2,
                           **kwargs)["link_solo"]
        # Both jobs run the same count, sized by the solo time (not by their own warm-ups,
        # which overlap at random): even a job that gets the link first and keeps most of it
        # then runs `seconds` at least, and the two overlap that long.
        shared = _run_probes(c, ["link_a", "link_b"], megabytes, seconds, MIN_RUN_S / 2,
                             gap_s=solo["wall_s_per_allreduce"], **kwargs)
    return {"bandwidth_mbit": bandwidth_mbit, **sharing(solo, shared)}


def measure_contention(bandwidth_mbit: float, megabytes: float = DEFAULT_MB,
                       seconds: float = 20.0, num_hosts: int = 2, timeout_s: float = 300.0,
                       log_dir: str = "runs/plan/contention", backend: str = "horovod"
                       ) -> LinkContention:
    """The planner's LinkContention on one emulated cluster at `bandwidth_mbit` (module
    docstring): a gapped job alone, alone beside a busy loop, and two gapped jobs at once
    (about a minute and a half)."""
    if seconds < MIN_RUN_S:
        raise ValueError(f"probe too short to measure: seconds >= {MIN_RUN_S}")
    with tempfile.TemporaryDirectory() as tmp, _shaped_cluster(bandwidth_mbit, num_hosts) as c:
        kwargs = {"tmp": pathlib.Path(tmp), "log_dir": log_dir, "timeout_s": timeout_s,
                  "env": {}, "random_gaps": True, "backend": backend}
        alone = _run_probes(c, ["gapped_solo"], megabytes, seconds, MIN_RUN_S / 2,
                            **kwargs)["gapped_solo"]
        # The later runs are sized by the solo allreduce, not by each job's noisy warm-up, so
        # that the two shared jobs run the same count over the same stretch.
        kwargs["gap_s"] = solo_s = _median_span_s(alone)
        burdened = _run_probes(c, ["gapped_busy_core"], megabytes, seconds, MIN_RUN_S / 2,
                               busy_core=True, **kwargs)["gapped_busy_core"]
        # Two jobs on one link: each allreduce takes about twice as long, so twice the seconds.
        shared = _run_probes(c, ["gapped_a", "gapped_b"], megabytes, 2 * seconds,
                             MIN_RUN_S / 2, **kwargs)
    fitted = fit_contention(solo_s, _median_span_s(burdened),
                            {name: probe["spans_s"] for name, probe in shared.items()})
    return dataclasses.replace(fitted, bandwidth_mbit=bandwidth_mbit,
                               probe={**fitted.probe, "megabytes": alone["megabytes"]})


def _median_span_s(probe: Mapping[str, Any]) -> float:
    return statistics.median(end - start for start, end in probe["spans_s"])


if __name__ == "__main__":  # one probe rank (launched by _run_probes)
    worker(float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4],
           sys.argv[5] or None, random_gaps=sys.argv[6] == "1", busy_core=sys.argv[7] == "1",
           gap_s=float(sys.argv[8]) if sys.argv[8] else None)
