"""The calibration runs: short solo runs at a few bandwidths until the fit (calibration.py)
settles the bandwidth for each asked-for M/C."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import statistics
import time
from typing import Any, Iterator, Sequence

from absl import logging

from crossover_tf_planner.job_stats import JobStats
from experiments.comparison import calibration, scenarios


def cluster(c: Any, bandwidth_mbit: float | None) -> Any:
    """The comparison's emulated cluster at a bandwidth (None: unshaped)."""
    from experiments.cluster import EmulatedCluster
    return EmulatedCluster(num_hosts=c.num_hosts, bandwidth_mbit=bandwidth_mbit,
                           latency_ms=c.latency_ms, force_localhost=c.force_localhost)


class NotEmulated(RuntimeError):
    """The cluster fell back to localhost ranks: no link to calibrate or probe."""


def solo_run(c: Any, out: pathlib.Path, bandwidth: float | None, run_name: str,
             job: str = "A", emulated: bool = True) -> tuple[JobStats, float, int]:
    """A short solo run of `job` (holding an uncontended lease) on a cluster at `bandwidth`:
    its stats, its wall time (start-up included) and its steps; NotEmulated on a localhost
    fallback unless `emulated` is False (a run that needs no shaped link)."""
    steps = c.warmup_steps + c.calibration_timed_steps
    with cluster(c, bandwidth) as hosts:
        if emulated and not hosts.is_emulated:
            raise NotEmulated(f"the emulated, shaped cluster fell back to localhost "
                              f"({hosts.fallback_reason})")
        started = time.monotonic()
        stats = scenarios.run_scenario(hosts, c, "sequential", out, run_name=run_name,
                                       jobs=(job,), steps=steps)[job]
        return stats, time.monotonic() - started, steps


def _calibration_point(c: Any, out: pathlib.Path, bandwidth: float
                       ) -> calibration.CalibrationPoint:
    """One calibration run (solo_run) at `bandwidth`, as a point of the fit."""
    try:
        stats, wall_s, steps = solo_run(c, out / "calibration", bandwidth,
                                        f"{bandwidth:.4g}mbit")
    except NotEmulated as err:
        raise RuntimeError(f"calibration needs shaped links: {err}; set --bandwidth_mbit") from None
    point = calibration.CalibrationPoint(bandwidth, stats.device_s, stats.comm_s, wall_s, steps,
                                         stats.step_time_s)
    logging.info("calibration at %.4g Mbit/s: C=%.1f ms, M=%.1f ms", bandwidth,
                 1e3 * point.compute_s, 1e3 * point.comm_s)
    return point


def drift_probe(c: Any, out: pathlib.Path, bandwidth: float, when: str
                ) -> dict[str, Any] | None:
    """The drift probe (issue 39): the same short solo run, with nothing else of the comparison
    running, before the trials and after them, so a machine or a project that slows over the
    run shows as a slower end than start. Beside it, what could pile up over a run
    (machine_census). None, with a warning, where the cluster fell back to localhost."""
    try:
        stats, wall_s, steps = solo_run(c, out / "drift_probe", bandwidth, when)
    except NotEmulated as err:
        logging.warning("no drift probe: %s", err)
        return None
    logging.info("drift probe (%s) at %.4g Mbit/s: step %.1f ms, C=%.1f ms, M=%.1f ms", when,
                 bandwidth, 1e3 * stats.step_time_s, 1e3 * stats.device_s, 1e3 * stats.comm_s)
    return {"step_s": stats.step_time_s, "compute_s": stats.device_s, "comm_s": stats.comm_s,
            "wall_s": wall_s, "steps": steps, **machine_census()}


def machine_census() -> dict[str, Any]:
    """What a run could leave behind and what else loads the machine: processes, network
    namespaces, files in /dev/shm (lease segments), the 1-minute load and the CPU time stolen
    by the hypervisor since boot (/proc/stat, seconds)."""
    from experiments.cluster import cleanup
    proc, shm = pathlib.Path("/proc"), pathlib.Path("/dev/shm")
    return {"processes": sum(1 for p in proc.iterdir() if p.name.isdigit()),
            "namespaces": len(cleanup.list_namespaces()),
            "shm_files": len(list(shm.iterdir())) if shm.is_dir() else None,
            "load_1min": os.getloadavg()[0], "steal_s": stolen_s()}


def stolen_s(stat: str = "/proc/stat") -> float | None:
    """CPU seconds the hypervisor has taken from this machine's cores since boot (all cores
    summed: the `steal` field of /proc/stat's first line); None where the kernel keeps none or
    it cannot be read (a record of the run, never a reason to lose it)."""
    try:
        with open(stat) as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else None
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def steal_record(into: dict[str, Any]) -> Iterator[None]:
    """Records in `into` what the hypervisor took while the block ran (for a scenario: its
    whole run, start-up included): stolen_s, wall_s and cpus (the share of the machine lost is
    stolen_s / (wall_s x cpus)); nothing where the kernel keeps no steal time. Why: a scenario
    run that lost the core to another tenant reads as contention between the jobs (issue 52's
    Horovod run: 6 s stolen over its trials)."""
    before, started = stolen_s(), time.monotonic()
    yield
    after = stolen_s()
    if before is not None and after is not None:
        into.update(stolen_s=after - before, wall_s=time.monotonic() - started,
                    cpus=os.cpu_count() or 1)


def calibrate(c: Any, out: pathlib.Path, ratios: Sequence[float]
              ) -> tuple[dict[float, float], dict[str, Any]]:
    """Solo runs at 2..MAX_POINTS bandwidths, the fit, and the bandwidth for each ratio;
    writes calibration.json first, so an unreachable ratio's error comes with its numbers."""
    target = statistics.geometric_mean(ratios)  # the points bracket the sweep's middle
    points = [_calibration_point(c, out, c.calibration_mbit)]
    while len(points) < calibration.MAX_POINTS:
        bandwidth = calibration.next_bandwidth(points, target)
        if bandwidth is None:
            break
        points.append(_calibration_point(c, out, bandwidth))
    record: dict[str, Any] = {"points": [dataclasses.asdict(p) for p in points]}
    saved = out / "calibration" / "calibration.json"
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(record, indent=2))  # kept even if the fit fails
    fit = calibration.fit_comm_model(points)
    compute_s = calibration.compute_time(points)
    record.update(fit=dataclasses.asdict(fit), compute_s=compute_s,
                  smallest_reachable_ratio=calibration.smallest_ratio(fit, compute_s))
    saved.write_text(json.dumps(record, indent=2))
    return {r: calibration.choose_bandwidth(fit, compute_s, r) for r in ratios}, record
