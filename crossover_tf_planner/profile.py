"""Job profiles: the per-step timing a planner needs, validated and saved as JSON.

A job's training step is modelled as a cycle of three phases:

* ``device``: compute (forward + backward) plus the optimizer apply, both under
  the device lease (``compute_s + apply_s``);
* ``link``: the gradient allreduce, i.e. time on the network at full bandwidth
  (``comm_s``);
* ``other``: whatever is left of the step that uses neither (input pipeline,
  Python overhead); it is ``step - device - link`` when measured.

On a CPU device (device_models.CPU) two more numbers matter. ``cpu_s`` is all the CPU time a
step uses (every thread of the process, measured by train.py), which is what the step demands
of a core shared by time slicing; the device hold can be longer (the hold also covers waits
that use no CPU). ``comm_cpu_s`` is the part the allreduce itself takes (Gloo's reduction, the
TCP stack, Horovod's and TensorFlow's threads), which lands inside the other job's hold when
the jobs cross; ``python -m experiments.probes --mode=calibrate`` measures what it costs.

Everything downstream (analytical model, simulator, sweep) reads only these
numbers, so a profile can come from a profiling run or be written by hand.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Sequence

from crossover_tf_planner import json_io
from crossover_tf_planner.job_stats import JobStats

SOURCES = ("measured", "manual", "synthetic")

_TIME_FIELDS = ("compute_s", "comm_s", "compute_std_s", "comm_std_s", "apply_s",
                "handoff_s", "other_s", "comm_cpu_s", "cpu_s")


@dataclasses.dataclass(frozen=True)
class JobProfile(json_io.JsonRecord):
    """Per-iteration timing of one training job (seconds, means and std devs)."""

    record_kind = "job profile"
    json_style = {"indent": 2, "sort_keys": True}

    name: str
    compute_s: float
    comm_s: float
    compute_std_s: float = 0.0
    comm_std_s: float = 0.0
    apply_s: float = 0.0
    handoff_s: float = 0.0
    other_s: float = 0.0
    comm_cpu_s: float = 0.0  # CPU seconds per step the allreduce takes (on the device core)
    cpu_s: float = 0.0  # CPU seconds per step of the whole process (0: unknown)
    images_per_step: float = 1.0
    source: str = "manual"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("JobProfile.name must be a non-empty string")
        for field in _TIME_FIELDS:
            _check_time(field, getattr(self, field), self.name)
        if self.compute_s <= 0:
            raise ValueError(f"JobProfile {self.name!r}: compute_s must be > 0 "
                             f"(got {self.compute_s}); a step always computes")
        _check_time("images_per_step", self.images_per_step, self.name)
        if self.images_per_step <= 0:
            raise ValueError(f"JobProfile {self.name!r}: images_per_step must be > 0")
        if self.source not in SOURCES:
            raise ValueError(f"JobProfile {self.name!r}: source must be one of "
                             f"{SOURCES} (got {self.source!r})")

    @property
    def device_s(self) -> float:
        """Time per step the job needs the device (compute + apply)."""
        return self.compute_s + self.apply_s

    @property
    def cpu_demand_s(self) -> float:
        """CPU seconds a step needs from a shared core: the measured cpu_s, else the device
        work plus what the allreduce takes."""
        return self.cpu_s or self.device_s + self.comm_cpu_s

    @property
    def period_s(self) -> float:
        """Solo step time: the job alone on its devices and links."""
        return self.device_s + self.comm_s + self.other_s

    @property
    def solo_images_per_s(self) -> float:
        return self.images_per_step / self.period_s


def _check_time(field: str, value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"JobProfile {name!r}: {field} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"JobProfile {name!r}: {field} must be finite and >= 0, got {value}")


def profile_from_train_stats(stats: JobStats, name: str | None = None, *,
                             handoff_s: float = 0.0, comm_cpu_s: float = 0.0) -> JobProfile:
    """Builds a profile from what ``experiments/train.py`` measured (its stats.json).

    Device time is the lease hold for forward/backward (``compute_s``) plus the apply
    (``apply_s``); ``comm_s`` is the allreduce; the rest of the median step (clipped at 0)
    becomes ``other_s``. The job must have run with a lease (the timeline gives the phases).
    """
    name = name or stats.job
    missing = [key for key in ("compute_s", "comm_s") if getattr(stats, key) is None]
    if missing:
        raise ValueError(f"training stats for {name!r} lack {', '.join(missing)}: profile a "
                         "job trained with a crossover group, whose lease timeline has them")
    apply = stats.apply_s or 0.0
    rest = stats.step_time_s - stats.compute_s - stats.comm_s - apply
    return JobProfile(name=name, compute_s=stats.compute_s, comm_s=stats.comm_s, apply_s=apply,
                      handoff_s=handoff_s, other_s=max(0.0, rest), comm_cpu_s=comm_cpu_s,
                      cpu_s=stats.cpu_s or 0.0,
                      images_per_step=float(stats.global_batch_size), source="measured")


def profile_from_record(data: Any) -> JobProfile:
    """A profile from a parsed JSON object of either kind a job writes: a job profile
    (``name``, ``compute_s``, ...: crossover_tf.ProfileCallback, or by hand) or job stats
    (``job``, ``step_time_s``, ...: experiments/train.py's stats.json), told apart by the field
    that names each kind."""
    if isinstance(data, dict) and JobStats.name_field in data:
        return profile_from_train_stats(JobStats.from_dict(data))
    if isinstance(data, dict) and JobProfile.name_field in data:
        return JobProfile.from_dict(data)
    raise ValueError(f"neither a {JobProfile.record_kind} (has '{JobProfile.name_field}', "
                     f"'compute_s', 'comm_s') nor {JobStats.record_kind} (has "
                     f"'{JobStats.name_field}', 'step_time_s', ...)")


def load_profile(path: str | os.PathLike) -> JobProfile:
    """Reads one job's profile from a profile file or a stats.json (``profile_from_record``);
    whatever is wrong with the file raises json_io.InputFileError naming it."""
    with json_io.naming_the_file(path):
        return profile_from_record(json_io.loads_text_or_file(path, "file"))


def load_profiles(paths: Sequence[str | os.PathLike]) -> list[JobProfile]:
    """Loads several profile or stats files (``load_profile``); the names must be unique."""
    profiles = [load_profile(path) for path in paths]
    names = [p.name for p in profiles]
    if len(set(names)) != len(names):
        raise json_io.InputFileError(f"job profile names must be unique, got {names} (from "
                                     f"{', '.join(os.fspath(p) for p in paths)})")
    return profiles
