"""The comparison record: what experiments/compare.py measures and writes as compare.json.

Typed, as JobStats is, because many readers share it: the comparison's trials, report, sweep,
attribution and replanning in experiments/, and the planner's validate here. It lives in the
TF-free planner package because validate (installed without experiments/) reads it, and
experiments/ depends on the planner, never the other way round. Dicts appear only at the JSON
boundary (to_dict/from_dict, to_json/from_json); the planner's own reports (``planner``) and
the probes' records (``regime.calibration``, ``comm_cpu``, ``link_contention``) are kept as the
JSON objects their own types read.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping, Sequence

from crossover_tf_planner.job_stats import JobStats
from crossover_tf_planner.registry import is_solo


def _drop_none(data: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """data without the optional `keys` whose value is None (absent in the JSON written)."""
    return {k: v for k, v in data.items() if not (k in keys and v is None)}


@dataclasses.dataclass(frozen=True)
class ScenarioResult:
    """One scenario of one trial: each job's stats, the aggregate rate, each job's rate in it
    (per_job_in_aggregate; absent in hand-made records: each job's own rate stands in), the
    concurrent window and the step durations a bootstrap resamples."""
    jobs: dict[str, JobStats]
    aggregate_images_per_s: float
    per_job_in_aggregate: dict[str, float] | None = None
    window_s: float | None = None
    step_s: dict[str, list[float]] | None = None

    def job_rate(self, job: str) -> float:
        """A job's rate in the scenario (per_job_in_aggregate, else its whole-run rate)."""
        rates = self.per_job_in_aggregate
        return float(rates[job]) if rates else self.jobs[job].images_per_s

    def to_dict(self) -> dict[str, Any]:
        return _drop_none({"jobs": {j: s.to_dict() for j, s in self.jobs.items()},
                           "aggregate_images_per_s": self.aggregate_images_per_s,
                           "per_job_in_aggregate": self.per_job_in_aggregate,
                           "window_s": self.window_s, "step_s": self.step_s},
                          ("per_job_in_aggregate", "window_s", "step_s"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScenarioResult:
        jobs = {j: JobStats.from_dict(s) for j, s in data.get("jobs", {}).items()}
        aggregate = data.get("aggregate_images_per_s")
        if aggregate is None:
            aggregate = sum(s.images_per_s for s in jobs.values())
        return cls(jobs, float(aggregate), data.get("per_job_in_aggregate"),
                   data.get("window_s"), data.get("step_s"))


@dataclasses.dataclass(frozen=True)
class Spread:
    """Median, min and max of a value over trials, and each trial's; of_trials is how many
    trials ran when fewer gave a value (a scenario invalid in some)."""
    median: float
    min: float
    max: float
    values: list[float]
    of_trials: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return _drop_none(dataclasses.asdict(self), ("of_trials",))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Spread:
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class Interval:
    """A ratio's bootstrap interval (experiments/analysis/intervals.py)."""
    low: float
    high: float
    level: float
    trials: int
    draws: int
    method: str


@dataclasses.dataclass(frozen=True)
class IdealRound:
    """The shortest round (one step of each job) that the resources a round needs allow, from
    the solo runs' mean times per step (experiments/analysis/ideal.py says why means and why
    it bounds every crossed scenario): kept so that compare.md can say what bounds the ideal."""
    device_s: float  # every job's compute + apply, one after another on the device
    link_s: float  # every job's allreduce at its solo length, one after another on the link
    step_s: float  # the longest solo step: no job steps faster than it does alone
    images: float  # images per round: one step of each job
    core_s: float | None = None  # every job's device holds plus its allreduce's CPU (the
    # comm-CPU probe's cost): an estimate shown beside the bound, never part of it (ideal.py
    # says why); None: the record has no probe

    @property
    def bounds_s(self) -> dict[str, float]:
        """Each bounding resource's seconds per round."""
        return {"device": self.device_s, "link": self.link_s, "own step": self.step_s}

    @property
    def round_s(self) -> float:
        return max(self.bounds_s.values())

    @property
    def bound_by(self) -> str:
        """The resource that sets the round."""
        bounds = self.bounds_s
        return max(bounds, key=bounds.__getitem__)

    def to_dict(self) -> dict[str, Any]:
        return _drop_none(dataclasses.asdict(self), ("core_s",))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> IdealRound | None:
        return cls(**data) if data else None


@dataclasses.dataclass(frozen=True)
class InvalidRun:
    """A scenario refused in a trial (None: a single trial's summary), and why."""
    trial: int | None
    reason: str


@dataclasses.dataclass(frozen=True)
class OrderDesign:
    """What the trials' scenario orders balance (experiments/comparison/trials.py)."""
    design: str
    rows: int
    trials: int
    positions_balanced: bool
    adjacency_balanced: bool


@dataclasses.dataclass(frozen=True)
class Regime:
    """The M/C the comparison asked for, the bandwidth that gave it and how it was found, what
    the solo runs achieved, and the probes' records the planner charges."""
    comm_to_compute_asked: float | None = None
    bandwidth_source: str = "fixed"
    calibration: dict[str, Any] | None = None
    comm_cpu: dict[str, Any] | None = None
    link_contention: dict[str, Any] | None = None
    bandwidth_mbit: float | None = None
    achieved_comm_to_compute: Spread | None = None
    # The same solo run before and after the trials (comparison/calibrate.drift_probe):
    # {"bandwidth_mbit", "start": {...}, "end": {...}}; absent in older records.
    drift_probe: dict[str, Any] | None = None
    # The asked-for T_B/T_A and job B's batch calibration (experiments/comparison/
    # period_calibrate.py); absent where job B is job A's twin.
    period_ratio_asked: float | None = None
    period_calibration: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.achieved_comm_to_compute is not None:
            data["achieved_comm_to_compute"] = self.achieved_comm_to_compute.to_dict()
        return _drop_none(data, ["drift_probe", "period_ratio_asked", "period_calibration"])

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Regime:
        achieved = data.get("achieved_comm_to_compute")
        return cls(**{**data, "achieved_comm_to_compute":
                      Spread.from_dict(achieved) if achieved else None})


def solo_stats(scenarios: Mapping[str, ScenarioResult]) -> dict[str, JobStats]:
    """Each job's solo run, in job order."""
    return {job: s for name in sorted(scenarios) if is_solo(name)
            for job, s in scenarios[name].jobs.items()}


def _scenarios(data: Mapping[str, Any]) -> dict[str, ScenarioResult]:
    return {name: ScenarioResult.from_dict(s) for name, s in data.items()}


@dataclasses.dataclass(frozen=True)
class Trial:
    """One trial's summary: its scenarios, ratios (registry keys), the scenarios refused and
    why, and the planner's check of it (validate.validate_comparison's report)."""
    scenarios: dict[str, ScenarioResult]
    ratios: dict[str, float] = dataclasses.field(default_factory=dict)
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)  # trial, order
    invalid: dict[str, str] = dataclasses.field(default_factory=dict)
    planner: dict[str, Any] | None = None
    ideal: IdealRound | None = None  # absent in records written before it

    def solo_stats(self) -> dict[str, JobStats]:
        return solo_stats(self.scenarios)

    def to_dict(self) -> dict[str, Any]:
        return _drop_none({"settings": self.settings,
                           "scenarios": {n: s.to_dict() for n, s in self.scenarios.items()},
                           "ratios": self.ratios, "invalid": self.invalid,
                           "planner": self.planner,
                           "ideal": self.ideal.to_dict() if self.ideal else None},
                          ("planner", "ideal"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trial:
        return cls(_scenarios(data.get("scenarios", {})), dict(data.get("ratios", {})),
                   dict(data.get("settings", {})), dict(data.get("invalid", {})),
                   data.get("planner"), IdealRound.from_dict(data.get("ideal")))


REQUIRED = ("scenarios",)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """compare.json: the representative trial's scenarios, the median ratios over trials with
    their spread and bootstrap interval, the scenarios refused, failed sanity checks, every
    trial, the settings (the comparison's config and its cluster), the order design, the
    regime, and the planner's check of the representative trial."""
    scenarios: dict[str, ScenarioResult]
    ratios: dict[str, float] = dataclasses.field(default_factory=dict)
    trials: int = 1
    representative_trial: int = 0
    ratio_spread: dict[str, Spread] = dataclasses.field(default_factory=dict)
    ratio_interval: dict[str, Interval] = dataclasses.field(default_factory=dict)
    invalid: dict[str, list[InvalidRun]] = dataclasses.field(default_factory=dict)
    checks: list[str] = dataclasses.field(default_factory=list)
    achieved_comm_to_compute: Spread | None = None
    per_trial: list[Trial] = dataclasses.field(default_factory=list)
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    order_design: OrderDesign | None = None
    regime: Regime | None = None
    planner: dict[str, Any] | None = None
    ideal: IdealRound | None = None  # the representative trial's; absent in older records
    # Per ratio, the trials a failed check left out of its median, spread and interval.
    left_out: dict[str, list[int]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of_trial(cls, trial: Trial) -> Comparison:
        """A single trial's summary read as a comparison of that one trial (no spread, no
        interval), so the report and the verdict take either."""
        return cls(trial.scenarios, trial.ratios, settings=trial.settings,
                   invalid={n: [InvalidRun(None, r)] for n, r in trial.invalid.items()},
                   planner=trial.planner, ideal=trial.ideal)

    def solo_stats(self) -> dict[str, JobStats]:
        return solo_stats(self.scenarios)

    @property
    def trials_or_self(self) -> list[Trial]:
        """Every trial; a comparison saved without them stands for its one trial."""
        return self.per_trial or [Trial(self.scenarios, self.ratios, planner=self.planner)]

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "trials": self.trials, "representative_trial": self.representative_trial,
            "scenarios": {n: s.to_dict() for n, s in self.scenarios.items()},
            "ratios": self.ratios,
            "ratio_spread": {k: s.to_dict() for k, s in self.ratio_spread.items()},
            "ratio_interval": {k: dataclasses.asdict(i) for k, i in self.ratio_interval.items()},
            "invalid": {n: [dataclasses.asdict(e) for e in runs]
                        for n, runs in self.invalid.items()},
            "checks": self.checks,
            "achieved_comm_to_compute": (self.achieved_comm_to_compute.to_dict()
                                         if self.achieved_comm_to_compute else None),
            "per_trial": [t.to_dict() for t in self.per_trial], "settings": self.settings,
            "order_design": (dataclasses.asdict(self.order_design) if self.order_design
                             else None),
            "regime": self.regime.to_dict() if self.regime else None, "planner": self.planner,
            "ideal": self.ideal.to_dict() if self.ideal else None,
            "left_out": self.left_out or None}
        return _drop_none(data, ("planner", "order_design", "regime",
                                 "achieved_comm_to_compute", "ideal", "left_out"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Comparison:
        """A comparison from its JSON object; a clear error naming what is missing."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a comparison must be a JSON object, got {type(data).__name__}")
        missing = [k for k in REQUIRED if not isinstance(data.get(k), Mapping)]
        if missing:
            raise ValueError(f"comparison JSON lacks a {' / '.join(repr(k) for k in missing)} "
                             "object")
        achieved = data.get("achieved_comm_to_compute")
        design, regime = data.get("order_design"), data.get("regime")
        return cls(
            _scenarios(data["scenarios"]), dict(data.get("ratios", {})),
            int(data.get("trials", 1)), int(data.get("representative_trial", 0)),
            {k: Spread.from_dict(s) for k, s in (data.get("ratio_spread") or {}).items()},
            {k: Interval(**i) for k, i in (data.get("ratio_interval") or {}).items()},
            _invalid(data.get("invalid") or {}), list(data.get("checks", [])),
            Spread.from_dict(achieved) if achieved else None,
            [Trial.from_dict(t) for t in data.get("per_trial", [])],
            dict(data.get("settings", {})), OrderDesign(**design) if design else None,
            Regime.from_dict(regime) if regime else None, data.get("planner"),
            IdealRound.from_dict(data.get("ideal")),
            {k: list(v) for k, v in (data.get("left_out") or {}).items()})

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2, default=str)
        if path is not None:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
        return text

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> Comparison:
        """Reads a compare.json; a file that is not one fails naming the file and what is
        missing or wrong."""
        try:
            with open(path, encoding="utf-8") as handle:
                return cls.from_dict(json.load(handle))
        except (ValueError, TypeError, KeyError) as error:
            raise ValueError(f"{os.fspath(path)}: not a comparison compare.py can read: "
                             f"{error}") from error


def _invalid(data: Mapping[str, Any]) -> dict[str, list[InvalidRun]]:
    """compare.json's invalid (name -> [{trial, reason}]), or a single trial's (name ->
    reason)."""
    return {name: ([InvalidRun(None, runs)] if isinstance(runs, str)
                   else [InvalidRun(**r) for r in runs]) for name, runs in data.items()}
