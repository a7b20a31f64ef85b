"""Predicted vs measured: checks the analytical model and the simulator against a
two-host comparison run (the JSON ``experiments/compare.py`` writes).

Profiles come from the solo scenarios only, so every pair scenario is a true
prediction. The analytical column uses the device model of the emulated cluster
(``cpu``: naive co-location keeps the core busy, allreduces take ``comm_cpu_s`` of
the core, from the comparison's or a given comm CPU calibration, and the link loses what
the comparison's regime.link_contention measured); the simulator
column keeps the GPU-like sharing (processor sharing from random phases), so the
table shows which model the measurement supports. Comparisons of more than two
jobs are checked against the FIFO round (analytical.fifo_round_s).

The primary metric is normalised throughput (sum over jobs of
images/s in the scenario / images/s solo): it does not depend on how a
scenario splits time between the jobs.  Ratios of aggregate images/s are
reported too.  Error = (predicted - measured) / measured, in %.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Union

from crossover_tf_planner import registry
from crossover_tf_planner.analytical import fifo_round_s, naive_round_s, predict_pair, recommend
from crossover_tf_planner.comm_cost import CommCpu, LinkContention
from crossover_tf_planner.compare_record import Comparison, Regime, Trial
from crossover_tf_planner.device_models import limitation_of
from crossover_tf_planner.job_stats import JobStats
from crossover_tf_planner.policies import MEASURED, VALIDATED
from crossover_tf_planner.profile import JobProfile, profile_from_train_stats
from crossover_tf_planner.simulator import SimJob, simulate

# What validate takes: a record, or a compare.json path or its parsed JSON (the boundary).
ComparisonInput = Union[Comparison, Trial, str, os.PathLike, Mapping[str, Any]]


def load_comparison(given: ComparisonInput) -> Comparison | Trial:
    """The record given, or read from a compare.json path or parsed JSON; a clear error when
    it lacks the solo scenarios the profiles come from."""
    if isinstance(given, Mapping):
        data: Comparison | Trial = Comparison.from_dict(given)
    elif isinstance(given, (Comparison, Trial)):
        data = given
    else:
        data = Comparison.from_json(given)
    solos = [name for name in data.scenarios if registry.is_solo(name)]
    if len(solos) < 2:
        raise ValueError(f"comparison JSON has solo scenarios {solos}; the profiles come from "
                         "at least two (solo_A, solo_B, ...)")
    return data


def _bandwidth(data: Comparison | Trial, regime: Regime | None) -> float | None:
    if regime is not None and regime.bandwidth_mbit:
        return regime.bandwidth_mbit
    return data.settings.get("bandwidth_mbit")


def wire_megabytes(data: Comparison | Trial, stats: JobStats,
                   regime: Regime | None = None) -> float:
    """MB a step's allreduce puts on the link: the calibration fit's bytes when the comparison
    calibrated its link (M = m0 + k/B, k Mbit), else M times the fixed bandwidth (an upper
    bound), else 0 (an unshaped link: nothing to go on)."""
    fit = ((regime.calibration or {}) if regime else {}).get("fit")
    if fit:
        return float(fit["per_mbit_s"]) / 8
    bandwidth = _bandwidth(data, regime)
    return float(bandwidth) * (stats.comm_s or 0.0) / 8 if bandwidth else 0.0


def _solo_job(data: Comparison | Trial, scenario: str) -> tuple[str, JobStats]:
    jobs = data.scenarios[scenario].jobs
    if len(jobs) != 1:
        raise ValueError(f"scenario {scenario!r} must hold exactly one job, has {len(jobs)}")
    ((name, job),) = jobs.items()
    return name, job


def _regime_of(data: Comparison | Trial, regime: Regime | None) -> Regime | None:
    """The regime given (a trial has none of its own), else the comparison's."""
    return regime if regime is not None else getattr(data, "regime", None)


def profiles_from_comparison(data: ComparisonInput,
                             comm_cpu: CommCpu | Mapping[str, Any] | None = None,
                             regime: Regime | None = None) -> tuple[JobProfile, ...]:
    """Job profiles from the solo scenarios, in job order (hand-off cost from
    settings.handoff_s; each allreduce's CPU cost from `comm_cpu`, else the regime's
    comm_cpu, else 0).

    Images per step are the measured rate times the median step, so that a profile's solo
    rate is exactly the measured one that measured_normalised divides by.
    """
    data = load_comparison(data)
    regime = _regime_of(data, regime)
    handoff = float(data.settings.get("handoff_s", 0.0))
    if comm_cpu is None and regime is not None:
        comm_cpu = regime.comm_cpu
    if comm_cpu is not None and not isinstance(comm_cpu, CommCpu):
        comm_cpu = CommCpu.from_dict(comm_cpu)
    profiles = []
    for scenario in sorted(n for n in data.scenarios if registry.is_solo(n)):
        name, stats = _solo_job(data, scenario)
        cpu_s = (comm_cpu.comm_cpu_s(stats.comm_s or 0.0, wire_megabytes(data, stats, regime))
                 if comm_cpu is not None else 0.0)
        profiles.append(dataclasses.replace(
            profile_from_train_stats(stats, name, handoff_s=handoff, comm_cpu_s=cpu_s),
            images_per_step=stats.images_per_s * stats.step_time_s))
    return tuple(profiles)


def measured_normalised(data: Comparison | Trial, profiles: tuple[JobProfile, ...]
                        ) -> dict[str, float]:
    """Normalised throughput of each measured pair scenario that has both jobs.

    A job's rate inside the pair is its rate in the aggregate when the comparison gives it
    (in a sequential pair each job runs at its solo rate but only half the time; in a
    concurrent one, the rate while both ran), else its images_per_s.
    """
    out = {}
    for name in VALIDATED:
        scenario = data.scenarios.get(name)
        if scenario is not None and all(p.name in scenario.jobs for p in profiles):
            out[name] = sum(scenario.job_rate(p.name) / p.solo_images_per_s for p in profiles)
    return out


def measured_winner(over_sequential: Mapping[str, float], min_gain: float = 0.05) -> str:
    """The measured winner of one measurement by the planner's own rule (the planner's check:
    a more involved policy must gain `min_gain`, as the recommendation it is checked against
    must): `recommend` on each pair scenario's aggregate images/s over the sequential pair's,
    the ratios the tables show. The normalised sum the planner optimises weights each job by
    its own solo rate instead, and can name another winner when the two solo runs differ.
    Over several trials, experiments/trials.verdict decides by bootstrap intervals instead;
    min_gain=0 names the faster policy of one trial."""
    return recommend(over_sequential, min_gain)[0]


def _aggregate_winner(measured_agg: Mapping[str, float]) -> str | None:
    if "sequential" not in measured_agg:
        return None
    return measured_winner({k: v / measured_agg["sequential"] for k, v in measured_agg.items()})


def _recommendation_among(predicted: Mapping[str, float], measured: Mapping[str, float]
                          ) -> str:
    """The planner's recommendation among the policies the comparison ran (and shift, which
    the planner may recommend whether or not it ran): a comparison without crossover_turn is
    checked on plain crossing."""
    return recommend({k: v for k, v in predicted.items() if k in measured or k == "shift"})[0]


def _error_pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


def _ratio_table(predicted: Mapping[str, Mapping[str, float]], measured: Mapping[str, float]
                 ) -> dict[str, dict[str, float]]:
    table = {}
    for ratio in registry.VALIDATED_RATIOS:
        top, bottom = ratio.top, ratio.bottom
        if top in measured and bottom in measured:
            row = {"measured": measured[top] / measured[bottom]}
            for model, values in predicted.items():
                if top not in values or bottom not in values:
                    continue  # e.g. the gpu-like simulator has no link turns
                row[model] = values[top] / values[bottom]
                row[f"{model}_error_pct"] = _error_pct(row[model], row["measured"])
            table[ratio.planner_key] = row
    return table


def validate_comparison(data_or_path: ComparisonInput, *, sim_steps: int = 120, seed: int = 0,
                        model: str = "cpu", comm_cpu: CommCpu | Mapping[str, Any] | None = None,
                        contention: LinkContention | None = None,
                        regime: Regime | None = None) -> dict[str, Any]:
    """Predicted vs measured ratios (analytical on device `model`, and the 2-host simulator)
    with % errors, and the recommendation against the measured winner (`measured_winner`);
    `comm_cpu` and `contention` replace the comparison's own measurements when given, and
    `regime` is a trial's (a comparison carries its own)."""
    data = load_comparison(data_or_path)
    regime = _regime_of(data, regime)
    profiles = profiles_from_comparison(data, comm_cpu, regime)
    measured = measured_normalised(data, profiles)
    measured_agg = {k: data.scenarios[k].aggregate_images_per_s
                    for k in VALIDATED if k in data.scenarios}
    if len(profiles) != 2:
        return _validate_fifo(profiles, measured, measured_agg)
    a, b = profiles
    if contention is None:
        contention = LinkContention.from_dict(regime.link_contention if regime else None)
    prediction = predict_pair(a, b, model=model, contention=contention)
    simulated = {policy: simulate([SimJob(a, (0, 1), policy), SimJob(b, (0, 1), policy)],
                                  n_hosts=2, steps=sim_steps, seed=seed)
                 for policy in MEASURED}
    predicted_norm = {"analytical": prediction.normalised,
                      "simulated": {k: sum(r.normalised.values()) for k, r in simulated.items()}}
    predicted_agg = {"analytical": prediction.images_per_s,
                     "simulated": {k: r.images_per_s for k, r in simulated.items()}}
    return {
        "device_model": prediction.device_model,
        "profiles": [p.to_dict() for p in profiles],
        "normalised_ratios": _ratio_table(predicted_norm, measured),
        "aggregate_images_ratios": _ratio_table(predicted_agg, measured_agg),
        "recommendation": {"predicted": _recommendation_among(prediction.normalised,
                                                              measured_agg),
                           "measured_winner": _aggregate_winner(measured_agg)},
        "link_contention": contention.to_dict(),
        "prediction": prediction.to_dict(),
    }


def _validate_fifo(profiles: tuple[JobProfile, ...], measured: Mapping[str, float],
                   measured_agg: Mapping[str, float]) -> dict[str, Any]:
    """N > 2 jobs (equal batches, as compare.py runs them) on the cpu model: crossover as FIFO
    rounds, naive as work-conserving sharing of the core, sequential as one job after
    another; one step per job per round."""
    sequential_round = sum(p.period_s for p in profiles)
    rounds = {"sequential": sequential_round, "naive": naive_round_s(profiles),
              "crossover": fifo_round_s(profiles, cpu=True)}
    predicted = {"analytical": {k: sequential_round / r for k, r in rounds.items()}}
    return {"device_model": "cpu", "profiles": [p.to_dict() for p in profiles],
            "normalised_ratios": _ratio_table(predicted, measured),
            "aggregate_images_ratios": _ratio_table(predicted, measured_agg),
            "recommendation": {"predicted": recommend(predicted["analytical"])[0],
                               "measured_winner": _aggregate_winner(measured_agg)},
            "rounds_s": rounds}


def to_markdown(report: Mapping[str, Any], recommendation: bool = True) -> str:
    """The report's predicted against measured table, its recommendation line and the device
    model's limitation; `recommendation=False` leaves the recommendation line out, for a report
    that prints one recommendation of its own (compare.md, where this table checks one
    trial)."""
    model = report.get("device_model", "cpu")
    lines = [f"| metric | ratio | measured | analytical, {model} model (err %) | "
             "simulated, gpu-like (err %) |", "|---|---|---|---|---|"]

    def cell(row: Mapping[str, float], key: str) -> str:
        return f"{row[key]:.3f} ({row[key + '_error_pct']:+.1f})" if key in row else "—"

    for metric in ("normalised_ratios", "aggregate_images_ratios"):
        for ratio, row in report[metric].items():
            lines.append(f"| {metric.split('_')[0]} | {ratio} | {row['measured']:.3f} | "
                         f"{cell(row, 'analytical')} | {cell(row, 'simulated')} |")
    if recommendation and "recommendation" in report:
        r = report["recommendation"]
        lines.append(f"\nRecommended: **{r['predicted']}**; measured winner: "
                     f"**{r['measured_winner'] or '— (no sequential run)'}**.")
    limitation = limitation_of(model)
    if limitation:
        lines.append(f"\n{limitation}")
    return "\n".join(lines)
