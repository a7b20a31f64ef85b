"""The ``gpu`` device model's parameters from a gpu_probe JSON (ops/gpu_probe, README
"Measuring your GPU"), so a user pairs jobs with numbers measured on *their* GPU.

* ``device_efficiency``: the fluid model's share of the device that two jobs computing at
  once get together (device_models.py). The probe's naive co-location with *host*
  communication (a sleep, as a Gloo allreduce waits) is exactly the model's case: two jobs of
  compute C and a resource-free phase M, at random relative phase. For each M/C point the
  efficiency is the one whose predicted naive/solo ratio (fluid.py, averaged over start
  offsets) equals the measured median; the parameter is the median over points. The *device*
  kind (a spin kernel holds the GPU while it "communicates", as NCCL does) is outside the
  model, so it is reported, not fitted.
* ``handoff_s``: the lease's context-switch cost, per host-communication point the median gap
  between one process's stream sync and the next holder's start, plus what a compute phase
  takes longer under crossover than alone (the new context's first kernels pay for the
  switch); the parameter is the median over points.

On the command line (no TensorFlow, no absl; scripts/gpu_probe.sh runs it):
    python -m crossover_tf_planner.gpu_calibration PROBE.json [--out_dir DIR]
prints the markdown and writes DIR/gpu_params.{json,md}.

A probe run of the CPU stand-in (gpu_probe_cpu) says so (``stand_in``); its parameters carry
that label and are never GPU numbers.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from typing import Any, Mapping, Sequence

import numpy as np

from crossover_tf_planner import fluid
from crossover_tf_planner.device_models import GPU, DeviceModel

_EFFICIENCY_RANGE = (0.05, 1.0)
_BISECTIONS = 10      # halves the range to < 0.001: far below trial-to-trial spread
_OFFSETS = 8          # random start phases the naive ratio is averaged over
_EVENTS = 400         # fluid phase completions per evaluation (steady state by then)


def load_probe(path: str | os.PathLike) -> dict[str, Any]:
    """Reads and checks a gpu_probe JSON (a clear error for anything else)."""
    with open(path, encoding="utf-8") as handle:
        probe = json.load(handle)
    if not isinstance(probe, dict) or probe.get("probe") != "gpu_probe":
        raise ValueError(f"{os.fspath(path)}: not a gpu_probe JSON")
    if probe.get("schema") != 1:
        raise ValueError(f"{os.fspath(path)}: gpu_probe schema {probe.get('schema')!r}, "
                         f"this planner reads schema 1")
    return probe


def predicted_naive_ratio(compute_s: float, comm_s: float, device_efficiency: float) -> float:
    """Two jobs' naive steps/s together over one job's alone, by the fluid model averaged over
    start offsets, when each computes compute_s and then waits comm_s off the device."""
    period = compute_s + comm_s
    offsets = np.linspace(0.0, period, _OFFSETS, endpoint=False)
    work = np.tile(np.array([[compute_s, 0.0, comm_s]] * 2), (_OFFSETS, 1, 1))
    steps = fluid.colocated_steps_per_s(work, offsets, device_efficiency=device_efficiency,
                                        n_events=_EVENTS)
    return float(steps.sum(axis=1).mean() * period)


def fit_efficiency(compute_s: float, comm_s: float, measured_ratio: float) -> float:
    """The device_efficiency whose predicted naive/solo ratio is measured_ratio (clipped to the
    model's range: the ratio rises with the efficiency)."""
    low, high = _EFFICIENCY_RANGE
    if measured_ratio >= predicted_naive_ratio(compute_s, comm_s, high):
        return high
    if measured_ratio <= predicted_naive_ratio(compute_s, comm_s, low):
        return low
    for _ in range(_BISECTIONS):
        mid = (low + high) / 2
        if predicted_naive_ratio(compute_s, comm_s, mid) < measured_ratio:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def _median(summary: Mapping[str, Any] | None) -> float | None:
    return None if not summary else float(summary["median"])


def _extra_compute_s(point: Mapping[str, Any]) -> float | None:
    """Median crossover compute phase minus median solo one (s, at least 0)."""
    def phases(mode: str) -> list[float]:
        return [ms for s in point["sessions"] if s["mode"] == mode and s["ok"]
                for ms in s["compute_ms"]]
    solo, crossed = phases("solo"), phases("crossover")
    if not solo or not crossed:
        return None
    return max(0.0, statistics.median(crossed) - statistics.median(solo)) / 1e3


def gpu_params(probe: Mapping[str, Any]) -> dict[str, Any]:
    """The gpu model's parameters and the per-point evidence behind them."""
    procs = probe["settings"]["procs"]
    if procs != 2:
        raise ValueError(f"the planner's model is of two jobs per device; this probe ran "
                         f"{procs} processes (rerun it with --procs=2)")
    compute_s = probe["calibration"]["compute_ms"] / 1e3
    points, efficiencies, handoffs = [], [], []
    for point in probe["points"]:
        ratios = point["ratios"]
        naive = _median(ratios.get("naive_vs_solo"))
        row = {"ratio": point["ratio"], "comm": point["comm"], "naive_vs_solo": naive,
               "crossover_vs_naive": _median(ratios.get("crossover_vs_naive")),
               "mps_vs_solo": _median(ratios.get("mps_vs_solo")),
               "handoff_us": _median(point.get("handoff_us")),
               "crossover_overlaps": point.get("crossover_overlaps", 0),
               "extra_compute_s": _extra_compute_s(point), "device_efficiency": None}
        if point["comm"] == "host" and naive is not None:
            row["device_efficiency"] = fit_efficiency(compute_s, point["comm_ms"] / 1e3, naive)
            efficiencies.append(row["device_efficiency"])
            if row["handoff_us"] is not None and row["extra_compute_s"] is not None:
                handoffs.append(row["handoff_us"] / 1e6 + row["extra_compute_s"])
        points.append(row)
    if not efficiencies:
        raise ValueError("the probe has no naive/solo ratio with host communication to fit "
                         "device_efficiency on (run it with --comm=host and solo, naive)")
    where = "CPU stand-in, NOT GPU numbers" if probe.get("stand_in") else "measured on a GPU"
    return {
        "device_efficiency": statistics.median(efficiencies),
        "handoff_s": statistics.median(handoffs) if handoffs else None,
        "stand_in": bool(probe.get("stand_in")),
        "device": probe.get("device", ""),
        "source": f"gpu_probe on {probe.get('device', '?')} ({where}): device_efficiency "
                  f"fitted to naive/solo with host communication, median of "
                  f"{len(efficiencies)} M/C points; handoff_s the lease's hand-off gap plus the "
                  f"longer compute phase after it",
        "points": points,
    }


def gpu_model(params: Mapping[str, Any]) -> DeviceModel:
    """The gpu DeviceModel with the measured device_efficiency and its source."""
    return dataclasses.replace(GPU, device_efficiency=params["device_efficiency"],
                               source=params["source"])


def to_markdown(params: Mapping[str, Any]) -> str:
    """The parameters in one sentence and the evidence as a table."""
    def cell(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    handoff = params["handoff_s"]
    head = (f"gpu model from {params['source']}: **device_efficiency = "
            f"{params['device_efficiency']:.3f}**, **handoff_s = "
            f"{cell(handoff, '.2e')}** (pass them as --device_efficiency and --handoff_s).")
    rows = "\n".join(
        f"| {p['ratio']:g} | {p['comm']} | {cell(p['naive_vs_solo'], '.2f')} | "
        f"{cell(p['crossover_vs_naive'], '.2f')} | {cell(p['mps_vs_solo'], '.2f')} | "
        f"{cell(p['handoff_us'], '.0f')} | {cell(p['device_efficiency'], '.3f')} |"
        for p in params["points"])
    return (f"{head}\n\n| M/C | comm | naive/solo | crossover/naive | mps/solo | hand-off us "
            f"| fitted efficiency |\n|---|---|---|---|---|---|---|\n{rows}")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: a probe JSON in, the parameters out (exit status 2 on a bad file)."""
    parser = argparse.ArgumentParser(prog="python -m crossover_tf_planner.gpu_calibration",
                                     description="gpu model parameters from a gpu_probe JSON")
    parser.add_argument("probe", help="the JSON ops/gpu_probe wrote (--out)")
    parser.add_argument("--out_dir", default=None, help="where gpu_params.{json,md} go")
    args = parser.parse_args(argv)
    try:
        params = gpu_params(load_probe(args.probe))
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"gpu_calibration: error: {args.probe}: {error}", file=sys.stderr)
        return 2
    text = to_markdown(params)
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        with open(os.path.join(args.out_dir, "gpu_params.json"), "w", encoding="utf-8") as out:
            json.dump(params, out, indent=2)
        with open(os.path.join(args.out_dir, "gpu_params.md"), "w", encoding="utf-8") as out:
            out.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
