"""What allreduces cost beside a comparison's jobs, measured at its bandwidth for the
planner: the regime's comm_cpu and link_contention records."""
from __future__ import annotations

import pathlib
from typing import Any, Mapping

from absl import logging

NONE = {"comm_cpu": None, "link_contention": None}


def measure_comm_costs(c: Any, out: pathlib.Path, bandwidth: float | None,
                       calibration: Mapping[str, Any] | None) -> dict[str, Any]:
    """The regime's comm_cpu (what an allreduce costs the shared core) and link_contention
    (what the link loses to allreduces overlapping at random, and an allreduce to a busy
    core), both from comm_cpu.py at the comparison's bandwidth and, when the link was
    calibrated, the job's own allreduce size; None each when switched off or the link is not
    shaped (nothing comparable to measure: the planner assumes no cost)."""
    if not c.comm_cpu_probe or bandwidth is None or c.force_localhost:
        return dict(NONE)
    from experiments.probes import comm_cpu
    fit = (calibration or {}).get("fit")
    megabytes = fit["per_mbit_s"] / 8 if fit else comm_cpu.DEFAULT_MB
    try:
        measured = comm_cpu.measure(bandwidth, megabytes=megabytes, num_hosts=c.num_hosts,
                                    log_dir=str(out / "logs" / "comm_cpu"),
                                    backend=c.backend)
        contention = comm_cpu.measure_contention(bandwidth, megabytes=megabytes,
                                                 seconds=c.contention_probe_seconds,
                                                 num_hosts=c.num_hosts,
                                                 log_dir=str(out / "logs" / "contention"),
                                                 backend=c.backend)
    except comm_cpu.NotShaped as err:
        logging.warning("comm costs not measured (the planner assumes none): %s", err)
        return dict(NONE)
    logging.info("comm CPU: %.3f CPU s per s waiting, %.2f CPU ms per MB; link contention: "
                 "shared efficiency %.3f, compute slowdown %.3f", measured.cpu_per_wait_s,
                 1e3 * measured.cpu_s_per_mb, contention.shared_efficiency,
                 contention.compute_slowdown)
    return {"comm_cpu": measured.to_dict(), "link_contention": contention.to_dict()}
