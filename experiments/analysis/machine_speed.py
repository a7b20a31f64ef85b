"""How fast this machine ran against the README's reference run, in one line.

Why: a ratio such as link turns / naive, or measured / ideal, holds at an M/C, but how much a
job's compute suffers beside the other's allreduce depends on the machine (issue 52: on a core
1.7 times as fast, link turns fell from 0.96 to 0.88 of the ideal at the same M/C). A reader
comparing a run with the README needs both runs' C and M, not only their ratio. The README's
run is docs/readme_run.json, one of docs/results.json's records (tests check that both and
the README's results table state the same figures), and every comparison's report says how its
solo C and M stand against it.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import statistics
from typing import Any, Mapping

from crossover_tf_planner import registry
from crossover_tf_planner.compare_record import Comparison

README_RUN = pathlib.Path(__file__).resolve().parents[2] / "docs" / "readme_run.json"


@dataclasses.dataclass(frozen=True)
class ReferenceRun:
    """The README's main job: each job's solo compute C and allreduce M (ms; the median over
    its trials' solo runs), what job A trained (the speed line compares only a job A that
    trains the same), and where they come from."""

    date: str
    commit: str
    backend: str
    compute_ms: dict[str, float]
    comm_ms: dict[str, float]
    model: str = "resnet20"
    dataset: str = "synthetic:cifar10"
    global_batch_size: int = 128
    machine: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ReferenceRun":
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - fields
        if unknown:
            raise ValueError(f"{README_RUN.name}: unknown keys {sorted(unknown)}")
        return cls(**data)


def load_reference(path: str | pathlib.Path | None = None) -> ReferenceRun | None:
    """The README's run (None where the file is absent: an installed package has no docs)."""
    path = pathlib.Path(README_RUN if path is None else path)
    if not path.exists():
        return None
    return ReferenceRun.from_dict(json.loads(path.read_text()))


def solo_times_ms(result: Comparison) -> dict[str, tuple[float, float]]:
    """{job: (C, M)} in ms, each the median over the trials' solo runs (the shown trial's where
    the comparison kept no per-trial ones)."""
    per_trial = [t.scenarios for t in result.per_trial] or [result.scenarios]
    times: dict[str, tuple[float, float]] = {}
    for job in sorted({j for scenarios in per_trial for name in scenarios
                       if registry.is_solo(name) for j in scenarios[name].jobs}):
        runs = [scenarios[registry.solo(job)].jobs[job] for scenarios in per_trial
                if registry.solo(job) in scenarios]
        runs = [r for r in runs if r.device_s is not None and r.comm_s is not None]
        if runs:
            times[job] = (1e3 * statistics.median(r.device_s for r in runs),
                          1e3 * statistics.median(r.comm_s for r in runs))
    return times


def speed_line(result: Comparison, reference: ReferenceRun | None) -> str | None:
    """One sentence: this run's solo C and M per job against the README's, and how much
    faster this machine's core computed: the ratio of the first job's C (job A is the same
    job in every comparison; a shift experiment resizes job B)."""
    if reference is None or not _trains_like(result.settings, reference):
        return None
    here = solo_times_ms(result)
    common = [job for job in here if job in reference.compute_ms and job in reference.comm_ms]
    if not common:
        return None
    speed = reference.compute_ms[common[0]] / here[common[0]][0]
    parts = "; ".join(f"job {j}: C {here[j][0]:.0f} ms (README {reference.compute_ms[j]:.0f}), "
                      f"M {here[j][1]:.0f} ms (README {reference.comm_ms[j]:.0f})"
                      for j in common)
    return (f"This machine against the README's run ({reference.date}, {reference.commit}, "
            f"{reference.backend}): {parts}; its core computed job {common[0]}'s step "
            f"{speed:.2f}x as fast.")


def _trains_like(settings: Mapping[str, Any], reference: ReferenceRun) -> bool:
    """Whether the comparison's job A trained what the README's did (a comparison without
    its settings recorded is taken as the main job's)."""
    return all(settings.get(key, value) == value for key, value in (
        ("model", reference.model), ("dataset", reference.dataset),
        ("global_batch_size", reference.global_batch_size)))
