"""Predicted vs measured: checks the analytical model and the simulator against a
two-host comparison run (the JSON ``experiments/compare.py`` writes).

Profiles come from the two solo scenarios only, so every pair scenario is a true
prediction.  The primary metric is normalised throughput (sum over jobs of
images/s in the scenario / images/s solo): it does not depend on how a
scenario splits time between the jobs.  Ratios of aggregate images/s are
reported too.  Error = (predicted - measured) / measured, in %.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

from crossover_tf_planner.analytical import predict_pair
from crossover_tf_planner.policies import MEASURED
from crossover_tf_planner.job_stats import JobStats
from crossover_tf_planner.profile import JobProfile, profile_from_train_stats
from crossover_tf_planner.simulator import SimJob, simulate

RATIOS = (("crossover", "sequential"), ("crossover", "naive"), ("naive", "sequential"))


def load_comparison(path_or_dict: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(path_or_dict, Mapping):
        data = dict(path_or_dict)
    else:
        with open(path_or_dict, encoding="utf-8") as handle:
            data = json.load(handle)
    scenarios = data.get("scenarios")
    if not isinstance(scenarios, Mapping):
        raise ValueError("comparison JSON lacks a 'scenarios' object")
    for solo in ("solo_A", "solo_B"):
        if solo not in scenarios:
            raise ValueError(f"comparison JSON lacks scenario {solo!r} (profiles come from it)")
    return data


def _solo_job(data: Mapping[str, Any], scenario: str) -> tuple[str, JobStats]:
    jobs = data["scenarios"][scenario].get("jobs", {})
    if len(jobs) != 1:
        raise ValueError(f"scenario {scenario!r} must hold exactly one job, has {len(jobs)}")
    ((name, job),) = jobs.items()
    return name, JobStats.from_dict(job)


def profiles_from_comparison(data: Mapping[str, Any]) -> tuple[JobProfile, JobProfile]:
    """Job profiles from the solo scenarios (hand-off cost from settings.handoff_s).

    Images per step are the measured rate times the median step, so that a profile's solo
    rate is exactly the measured one that measured_normalised divides by.
    """
    handoff = float(data.get("settings", {}).get("handoff_s", 0.0))
    profiles = []
    for scenario in ("solo_A", "solo_B"):
        name, stats = _solo_job(data, scenario)
        profiles.append(dataclasses.replace(
            profile_from_train_stats(stats, name, handoff_s=handoff),
            images_per_step=stats.images_per_s * stats.step_time_s))
    return profiles[0], profiles[1]


def measured_normalised(data: Mapping[str, Any], profiles: tuple[JobProfile, JobProfile]
                        ) -> dict[str, float]:
    """Normalised throughput of each measured pair scenario that has both jobs.

    A job's rate inside the pair is `per_job_in_aggregate` when the comparison gives it (in a
    sequential pair each job runs at its solo rate but only half the time; in a concurrent one,
    the rate while both ran), else its `images_per_s`.
    """
    out = {}
    for scenario in MEASURED:
        entry = data["scenarios"].get(scenario, {})
        jobs = entry.get("jobs", {})
        if all(p.name in jobs for p in profiles):
            rates = entry.get("per_job_in_aggregate") or {
                p.name: jobs[p.name]["images_per_s"] for p in profiles}
            out[scenario] = sum(float(rates[p.name]) / p.solo_images_per_s for p in profiles)
    return out


def _error_pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


def _ratio_table(predicted: Mapping[str, Mapping[str, float]], measured: Mapping[str, float]
                 ) -> dict[str, dict[str, float]]:
    table = {}
    for top, bottom in RATIOS:
        if top in measured and bottom in measured:
            row = {"measured": measured[top] / measured[bottom]}
            for model, values in predicted.items():
                row[model] = values[top] / values[bottom]
                row[f"{model}_error_pct"] = _error_pct(row[model], row["measured"])
            table[f"{top}/{bottom}"] = row
    return table


def validate_comparison(data_or_path: str | os.PathLike | Mapping[str, Any], *,
                        sim_steps: int = 120, seed: int = 0) -> dict[str, Any]:
    """Predicted vs measured ratios (analytical and 2-host simulator) with % errors."""
    data = load_comparison(data_or_path)
    a, b = profiles_from_comparison(data)
    prediction = predict_pair(a, b)
    simulated = {policy: simulate([SimJob(a, (0, 1), policy), SimJob(b, (0, 1), policy)],
                                  n_hosts=2, steps=sim_steps, seed=seed)
                 for policy in MEASURED}
    predicted_norm = {"analytical": prediction.normalised,
                      "simulated": {k: sum(r.normalised.values()) for k, r in simulated.items()}}
    measured_agg = {k: float(data["scenarios"][k]["aggregate_images_per_s"])
                    for k in MEASURED
                    if "aggregate_images_per_s" in data["scenarios"].get(k, {})}
    predicted_agg = {"analytical": prediction.images_per_s,
                     "simulated": {k: r.images_per_s for k, r in simulated.items()}}
    return {
        "profiles": [a.to_dict(), b.to_dict()],
        "normalised_ratios": _ratio_table(predicted_norm, measured_normalised(data, (a, b))),
        "aggregate_images_ratios": _ratio_table(predicted_agg, measured_agg),
        "prediction": prediction.to_dict(),
    }


def to_markdown(report: Mapping[str, Any]) -> str:
    lines = ["| metric | ratio | measured | analytical (err %) | simulated (err %) |",
             "|---|---|---|---|---|"]
    for metric in ("normalised_ratios", "aggregate_images_ratios"):
        for ratio, row in report[metric].items():
            lines.append(f"| {metric.split('_')[0]} | {ratio} | {row['measured']:.3f} | "
                         f"{row['analytical']:.3f} ({row['analytical_error_pct']:+.1f}) | "
                         f"{row['simulated']:.3f} ({row['simulated_error_pct']:+.1f}) |")
    return "\n".join(lines)
