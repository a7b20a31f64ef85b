"""The CPU an allreduce takes from the core it shares with another job's compute, as the
planner's cpu device model charges it (device_models.CPU); measured by experiments/comm_cpu.py
(``plan.py --mode=calibrate``). Plain Python, no TensorFlow.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping


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
    transfers cost beyond it, per MB, is the rest."""
    per_wait = probe["idle_cpu_s"] / probe["idle_wall_s"]
    beyond = probe["cpu_s_per_allreduce"] - per_wait * probe["wall_s_per_allreduce"]
    return CommCpu(cpu_per_wait_s=per_wait, cpu_s_per_mb=max(0.0, beyond) / probe["megabytes"],
                   probe=dict(probe))
