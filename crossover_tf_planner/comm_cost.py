"""What communication costs a co-located pair beyond the solo allreduce, as the planner charges
it; measured by experiments/probes/comm_cpu.py. Plain Python, no TensorFlow.

* ``CommCpu``: the CPU an allreduce takes from the core it shares with another job's compute
  (the cpu device model, device_models.CPU; ``python -m experiments.probes --mode=calibrate``).
* ``LinkContention``: what the link loses when two jobs' allreduces overlap without
  coordination, and how much longer an allreduce takes while its host's core computes
  (``experiments.probes --mode=contention``). Why it matters: where the link is the
  bottleneck (M > C), naive co-location and plain crossing both let allreduces overlap at
  random, and a link that moves less while shared that way caps them both; link turns (one
  allreduce at a time) do not pay it.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

from crossover_tf_planner import json_io


@dataclasses.dataclass(frozen=True)
class CommCpu:
    """Per-rank CPU cost of allreduces, fitted from one probe run."""

    cpu_per_wait_s: float  # CPU seconds per second blocked with nothing to move
    cpu_s_per_mb: float  # CPU seconds per MB allreduced, beyond the waiting cost
    bandwidth_mbit: float | None = None  # the link the probe ran on
    probe: dict[str, float] = dataclasses.field(default_factory=dict)  # raw measurements

    def comm_cpu_s(self, comm_s: float, megabytes: float) -> float:
        """CPU seconds a step's allreduce of `megabytes` lasting `comm_s` takes from its core."""
        return self.cpu_per_wait_s * comm_s + self.cpu_s_per_mb * megabytes

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CommCpu":
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


def fit(probe: Mapping[str, float]) -> CommCpu:
    """The two coefficients from a probe: the idle wait gives the polling cost; what the
    transfers cost beyond it, per MB, is the rest, with the kernel's network work on the
    rank's core (``softirq_s_per_allreduce``, where the probe measured it): a process's own
    CPU time leaves that out, and it lands on the core the other job computes on (issue 52: at
    the comparisons' links, 15–20 ms of softirq a crossed hold). Sampled at the tick, a
    softirq that interrupts the rank itself is in its CPU time too, so this can count part of
    it twice; the thread probe's exact figure is what a hold pays."""
    per_wait = probe["idle_cpu_s"] / probe["idle_wall_s"]
    per_allreduce = probe["cpu_s_per_allreduce"] + probe.get("softirq_s_per_allreduce", 0.0)
    beyond = per_allreduce - per_wait * probe["wall_s_per_allreduce"]
    return CommCpu(cpu_per_wait_s=per_wait, cpu_s_per_mb=max(0.0, beyond) / probe["megabytes"],
                   probe=dict(probe))


@dataclasses.dataclass(frozen=True)
class LinkContention:
    """Two measured factors of a host's link and core (1.0 each: no loss, the ideal link)."""

    shared_efficiency: float = 1.0  # solo link-seconds moved per second some allreduce is in
    # flight, with two jobs' allreduces overlapping at random (1: sharing loses nothing)
    compute_slowdown: float = 1.0  # an allreduce's time with its host's core busy computing,
    # over with the core idle (the cpu device model only: a GPU's compute is not on that core)
    bandwidth_mbit: float | None = None  # the link the probe ran on
    probe: dict[str, Any] = dataclasses.field(default_factory=dict)  # raw measurements

    def __post_init__(self) -> None:
        if not 0 < self.shared_efficiency <= 1.5 or not 0.5 <= self.compute_slowdown <= 10:
            raise ValueError(f"implausible link contention: shared_efficiency "
                             f"{self.shared_efficiency} (0, 1.5], compute_slowdown "
                             f"{self.compute_slowdown} [0.5, 10]")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "LinkContention":
        """The record a comparison saved, or no contention (1, 1) for one without it."""
        if not data:
            return cls()
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


NO_CONTENTION = LinkContention()


def load_link_contention(path: str | os.PathLike) -> LinkContention:
    """The LinkContention record a probe saved (contention.json of ``experiments.probes
    --mode=contention``); a bad file raises json_io.InputFileError naming it."""
    with json_io.naming_the_file(path):
        return LinkContention.from_dict(json_io.loads_text_or_file(path, "link contention"))


def busy_s(spans: Sequence[tuple[float, float]]) -> float:
    """Seconds during which at least one of the (start, end) spans is under way."""
    total, current = 0.0, None
    for start, end in sorted(spans):
        if current is None or start > current[1]:
            total += 0.0 if current is None else current[1] - current[0]
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    return total + (0.0 if current is None else current[1] - current[0])


def fit_contention(solo_s: float, burdened_s: float,
                   shared: Mapping[str, Sequence[tuple[float, float]]]) -> LinkContention:
    """The two factors from a contention probe: the median solo allreduce (core idle), the
    median one with the core busy, and two jobs' allreduce spans from a run where each waited
    a random gap between its allreduces. Only spans inside the window where both jobs ran
    count: shared efficiency = (their number x the solo time) / the seconds some was in flight."""
    if solo_s <= 0 or burdened_s <= 0:
        raise ValueError("allreduce times must be > 0")
    start = max(spans[0][0] for spans in shared.values())
    end = min(spans[-1][1] for spans in shared.values())
    inside = {name: [(s, e) for s, e in spans if s >= start and e <= end]
              for name, spans in shared.items()}
    if any(len(spans) < 3 for spans in inside.values()):
        raise RuntimeError(f"contention probe: too few allreduces while both jobs ran "
                           f"({ {k: len(v) for k, v in inside.items()} }), run it longer")
    every = [span for spans in inside.values() for span in spans]
    return LinkContention(
        shared_efficiency=len(every) * solo_s / busy_s(every),
        compute_slowdown=burdened_s / solo_s,
        probe={"solo_s": solo_s, "burdened_s": burdened_s, "window_s": end - start,
               "allreduces": {k: len(v) for k, v in inside.items()}})
