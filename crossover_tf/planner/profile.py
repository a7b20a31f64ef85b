"""Job profiles: the per-step timing a planner needs, validated and saved as JSON.

A job's training step is modelled as a cycle of three phases:

* ``device``: compute (forward + backward) plus the optimizer apply, both under
  the device lease (``compute_s + apply_s``);
* ``link``: the gradient allreduce, i.e. time on the network at full bandwidth
  (``comm_s``);
* ``other``: whatever is left of the step that uses neither (input pipeline,
  Python overhead); it is ``step - device - link`` when measured.

Everything downstream (analytical model, simulator, sweep) reads only these
numbers, so a profile can come from a profiling run or be written by hand.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Mapping

SOURCES = ("measured", "manual", "synthetic")

_TIME_FIELDS = ("compute_s", "comm_s", "compute_std_s", "comm_std_s", "apply_s",
                "handoff_s", "other_s")


@dataclasses.dataclass(frozen=True)
class JobProfile:
    """Per-iteration timing of one training job (seconds, means and std devs)."""

    name: str
    compute_s: float
    comm_s: float
    compute_std_s: float = 0.0
    comm_std_s: float = 0.0
    apply_s: float = 0.0
    handoff_s: float = 0.0
    other_s: float = 0.0
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
    def period_s(self) -> float:
        """Solo step time: the job alone on its devices and links."""
        return self.device_s + self.comm_s + self.other_s

    @property
    def solo_images_per_s(self) -> float:
        return self.images_per_step / self.period_s

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """Serialises the profile; also writes it to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True)
        if path is not None:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")
        return text

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JobProfile":
        if not isinstance(data, Mapping):
            raise ValueError(f"a job profile must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        missing = [f for f in ("name", "compute_s", "comm_s") if f not in data]
        if missing:
            raise ValueError(f"job profile {data.get('name', '?')!r} is missing "
                             f"required field(s): {', '.join(missing)}")
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"job profile {data.get('name')!r} has unknown field(s): "
                             f"{', '.join(unknown)}")
        return cls(**dict(data))

    @classmethod
    def from_json(cls, text_or_path: str | os.PathLike) -> "JobProfile":
        """Reads a profile from a JSON string or from a file path."""
        text = str(text_or_path)
        if not text.lstrip().startswith("{"):
            with open(text_or_path, encoding="utf-8") as handle:
                text = handle.read()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"job profile is not valid JSON: {error}") from error
        return cls.from_dict(data)


def _check_time(field: str, value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"JobProfile {name!r}: {field} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"JobProfile {name!r}: {field} must be finite and >= 0, got {value}")


def _stat(stats: Mapping[str, Any], key: str, name: str) -> float:
    if key not in stats or stats[key] is None:
        raise ValueError(f"training stats for {name!r} lack {key!r} "
                         f"(have: {', '.join(sorted(stats)) or 'nothing'})")
    try:
        value = float(stats[key])
    except (TypeError, ValueError) as error:
        raise ValueError(f"training stats for {name!r}: {key}={stats[key]!r} "
                         "is not a number") from error
    _check_time(key, value, name)
    return value


def profile_from_train_stats(stats: Mapping[str, Any], name: str) -> JobProfile:
    """Builds a profile from the statistics ``experiments/train.py`` returns.

    Expected keys (seconds are medians over the profiled steps):

    * ``step_time_s``: wall time of one training step;
    * ``compute_s``: time the device lease is held per step (compute + apply);
    * ``comm_s``: time between yielding and re-acquiring the lease (allreduce);
    * ``global_batch_size``: images per step over all ranks.

    Optional: ``apply_s`` (when given, as ``crossover_tf.timeline`` reports it,
    ``compute_s`` is forward/backward only; when absent, ``compute_s`` includes
    the apply), ``compute_std_s``, ``comm_std_s``, ``handoff_s``.  The rest of
    the step (``step - compute - apply - comm``, clipped at 0) becomes ``other_s``.
    """
    if not isinstance(stats, Mapping):
        raise ValueError(f"training stats for {name!r} must be a dict, got {type(stats).__name__}")
    step = _stat(stats, "step_time_s", name)
    compute = _stat(stats, "compute_s", name)
    comm = _stat(stats, "comm_s", name)
    batch = _stat(stats, "global_batch_size", name)
    optional = {key: _stat(stats, key, name)
                for key in ("apply_s", "compute_std_s", "comm_std_s", "handoff_s")
                if key in stats}
    rest = step - compute - comm - optional.get("apply_s", 0.0)
    return JobProfile(name=name, compute_s=compute, comm_s=comm,
                      other_s=max(0.0, rest), images_per_step=batch,
                      source="measured", **optional)


def load_profiles(paths: list[str]) -> list[JobProfile]:
    """Loads several profile files; the names must be unique."""
    profiles = [JobProfile.from_json(path) for path in paths]
    names = [p.name for p in profiles]
    if len(set(names)) != len(names):
        raise ValueError(f"job profile names must be unique, got {names}")
    return profiles
