"""The calibration runs: short solo runs at a few bandwidths until the fit (calibration.py)
settles the bandwidth for each asked-for M/C."""
from __future__ import annotations

import dataclasses
import json
import pathlib
import statistics
from typing import Any, Sequence

from absl import logging

from experiments.comparison import calibration, scenarios


def cluster(c: Any, bandwidth_mbit: float | None) -> Any:
    """The comparison's emulated cluster at a bandwidth (None: unshaped)."""
    from experiments.cluster import EmulatedCluster
    return EmulatedCluster(num_hosts=c.num_hosts, bandwidth_mbit=bandwidth_mbit,
                           latency_ms=c.latency_ms, force_localhost=c.force_localhost)


def _calibration_point(c: Any, out: pathlib.Path, bandwidth: float
                       ) -> calibration.CalibrationPoint:
    """A short solo run of job A (holding an uncontended lease) on a cluster at `bandwidth`."""
    with cluster(c, bandwidth) as emulated:
        if not emulated.is_emulated:
            raise RuntimeError(f"calibration needs the emulated, shaped cluster, but it fell back "
                               f"to localhost ({emulated.fallback_reason}); set --bandwidth_mbit")
        stats = scenarios.run_scenario(
            emulated, c, "sequential", out / "calibration", run_name=f"{bandwidth:.4g}mbit",
            jobs=("A",), steps=c.warmup_steps + c.calibration_timed_steps)["A"]
    point = calibration.CalibrationPoint(bandwidth, stats.device_s, stats.comm_s)
    logging.info("calibration at %.4g Mbit/s: C=%.1f ms, M=%.1f ms", bandwidth,
                 1e3 * point.compute_s, 1e3 * point.comm_s)
    return point


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
