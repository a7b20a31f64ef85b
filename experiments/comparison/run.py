"""One comparison at one bandwidth: every scenario in every trial, each trial's summary held to
the sanity bounds, the summaries combined, the planner's check, and compare.{json,md,png} with
the attribution of the crossed rounds; and the sweep of such comparisons over M/C."""
from __future__ import annotations

import dataclasses
import json
import pathlib
import statistics
import time
import types
from typing import Any, Sequence

from absl import logging

from crossover_tf_planner import registry
from crossover_tf_planner.compare_record import Comparison, Regime
from crossover_tf_planner.job_stats import JobStats
from experiments import config as config_lib
from experiments.analysis import bounds, planning, report, shift_experiment, sweep, upfront
from experiments.analysis import regime as regime_lib
from experiments.comparison import (budget, calibrate, calibration, period_calibrate, progress,
                                    scenarios, settings, shift, summary, trials)
from experiments.probes.comm_costs import measure_comm_costs

TrialStats = dict[str, dict[str, JobStats]]  # scenario -> job -> stats, of one trial


def _run_trials(c: Any, out: pathlib.Path, bandwidth: float | None, regime: Regime
                ) -> tuple[list[TrialStats], dict[str, Any], list[dict[str, Any]]]:
    """Every scenario `c.trials` times, in the orders of a Williams design
    (trials.trial_orders), each trial on a cluster at its link: the first at `bandwidth`, the
    next re-shaped when a trial's solo runs drifted out of the regime (_next_link). Returns
    the stats, the first cluster's description and each trial's settings (its bandwidth, and
    the shift scenario's plan where it ran)."""
    stats: list[TrialStats] = []
    trial_settings: list[dict[str, Any]] = []
    cluster_info: dict[str, Any] = {}
    tracker = progress.TrialProgress(c.trials)
    for trial, order in enumerate(trials.trial_orders(settings.scenario_names(c), c.trials)):
        if trial:
            bandwidth = _next_link(stats[-1], bandwidth, regime, trial - 1, c.period_ratio)
        if trial and c.period_ratio:
            c = period_calibrate.with_batch(c, period_calibrate.next_batch(
                stats[-1], c, regime.period_calibration or {}, trial - 1))
        stats.append({})
        trial_settings.append({"bandwidth_mbit": bandwidth, **({
            "period_ratio": c.period_ratio, "job_b_global_batch_size": c.job_b_global_batch_size
        } if c.period_ratio else {})})
        with calibrate.cluster(c, bandwidth) as cluster:
            cluster_info = cluster_info or cluster.describe()
            for name in order:
                stats[-1][name] = _run_in_trial(cluster, c, name, out, trial, stats,
                                                trial_settings[-1])
        tracker.trial_done(order)
    return stats, cluster_info, trial_settings


def _run_in_trial(cluster: Any, c: Any, name: str, out: pathlib.Path, trial: int,
                  done: Sequence[TrialStats], trial_settings: dict[str, Any]
                  ) -> dict[str, JobStats]:
    """One scenario of a trial; the shift scenario gets its start shifts, computed once from
    the latest solo runs in `done` (comparison/shift.py), and records them with the rule's
    plan in `trial_settings`, where every scenario records the CPU time the hypervisor took
    while it ran (calibrate.steal_record; the report's steal table)."""
    shifted = {}
    if name == registry.SHIFT:
        shifts, plan = shift.start_shifts(shift.latest_solos(done))
        trial_settings["shift"] = {"start_shifts_s": shifts, **plan.to_dict()}
        shifted = {"start_shifts": shifts}
    with calibrate.steal_record(trial_settings.setdefault("steal", {}).setdefault(name, {})):
        return scenarios.run_scenario(cluster, c, name, out, f"t{trial}_{name}",
                                      jobs=scenarios.job_names(c.jobs), **shifted)


def _next_link(done: TrialStats, bandwidth: float | None, regime: Regime, trial: int,
               period_ratio: float = 0.0) -> float | None:
    """The link for the trial after `done` (issue 39): unchanged while its solo runs' M/C is
    within regime.TOLERANCE of the asked-for one; else re-shaped from their C and M
    (calibration.reshaped_bandwidth; job A's alone with a `period_ratio`). A fixed link, or
    one the fit cannot move, stays."""
    fit = (regime.calibration or {}).get("fit")
    asked = regime.comm_to_compute_asked
    if asked is None or bandwidth is None or not fit:
        return bandwidth
    solos = trials.regime_solos(done[registry.SEQUENTIAL], {"period_ratio": period_ratio})
    compute_s = statistics.fmean(s.device_s for s in solos)
    comm_s = statistics.fmean(s.comm_s for s in solos)
    if regime_lib.in_tolerance(comm_s / compute_s, asked):
        return bandwidth
    try:
        reshaped = calibration.reshaped_bandwidth(
            calibration.CommFit(**fit), bandwidth, compute_s, comm_s, asked)
    except ValueError as err:
        logging.warning("trial %d drifted to M/C %.2f but the link cannot follow (%s); the "
                        "next trial runs at %.4g Mbit/s", trial, comm_s / compute_s, err,
                        bandwidth)
        return bandwidth
    logging.warning("trial %d ran at M/C %.2f (C %.0f ms, M %.0f ms) against %g asked: the "
                    "link goes from %.4g to %.4g Mbit/s for the next trial", trial,
                    comm_s / compute_s, 1e3 * compute_s, 1e3 * comm_s, asked, bandwidth,
                    reshaped)
    return reshaped


def _fit_budget(c: Any, regime: Regime, bandwidth: float | None, started: float | None
                ) -> Any:
    """The settings with --steps shortened to fit --budget_minutes (budget.fitting_steps), and
    the estimated length printed (issue 34); unchanged without a calibration to estimate
    from."""
    cost = budget.run_cost(regime.calibration or {}, bandwidth) if bandwidth else None
    if cost is None:
        (logging.warning if c.budget_minutes else logging.info)(
            "no length estimate%s: a fixed link has no calibration runs to time",
            " and --budget_minutes is not applied" if c.budget_minutes else "")
        return c
    names = settings.scenario_names(c)
    probes_s = (2 * cost.solo_run_s(c.warmup_steps + c.calibration_timed_steps)
                if _probes_drift(c, bandwidth) else 0.0)
    elapsed_s = time.monotonic() - started if started is not None else 0.0
    steps = c.steps
    if c.budget_minutes:
        steps = budget.fitting_steps(cost, names, c.jobs, c.trials, c.steps, c.warmup_steps,
                                     60 * c.budget_minutes - elapsed_s - probes_s)
    total_s = elapsed_s + probes_s + budget.trials_s(cost, names, c.jobs, steps, c.trials)
    print(f"Estimated length: {total_s / 60:.0f} min ({elapsed_s / 60:.1f} min so far; "
          f"{c.trials} trials of {len(names)} scenarios at {steps} steps, a solo step "
          f"{1e3 * cost.step_s:.0f} ms and {cost.start_up_s:.0f} s of start-up per launch"
          + (f"; --steps {c.steps} shortened to {steps} to fit --budget_minutes="
             f"{c.budget_minutes:g}" if steps != c.steps else "") + ")", flush=True)
    if c.budget_minutes and total_s > 60 * c.budget_minutes:
        logging.warning("the comparison will overrun --budget_minutes=%g even at %d steps",
                        c.budget_minutes, steps)
    return types.SimpleNamespace(**{**vars(c), "steps": steps, "estimated_s": total_s})


def _probes_drift(c: Any, bandwidth: float | None) -> bool:
    """Whether the drift probe runs: asked for, on an emulated, shaped link."""
    return bool(c.drift_probe) and bandwidth is not None and not c.force_localhost


def _shape_job_b(c: Any, out: pathlib.Path, bandwidth: float | None, regime: Regime
                 ) -> tuple[Any, Regime]:
    """Job B's batch calibrated to --period_ratio (period_calibrate.py), and the planner's
    prediction from the calibration's solo runs, made and printed before any trial (issue 50:
    a call that cannot have seen the measurement); both kept in the regime."""
    c, record, solos = period_calibrate.shape_job_b(c, out, bandwidth)
    regime = dataclasses.replace(regime, period_ratio_asked=c.period_ratio,
                                 period_calibration=record)
    before = upfront.predict_before(solos, regime)
    print(f"Planner, before the trials (T_B/T_A {c.period_ratio:g}): recommends "
          f"{before['recommendation']} ({before['policy']}); over naive: " + ", ".join(
              f"{p} {r:.3f}" for p, r in before["over_naive"].items()), flush=True)
    return c, dataclasses.replace(regime, period_calibration={**record, "prediction": before})


def compare_at(c: Any, out: pathlib.Path, bandwidth: float | None, regime: Regime,
               started: float | None = None) -> Comparison:
    """Runs the trials at one bandwidth, between the drift probes; writes compare.{json,md,png}
    in `out`. `started` (time.monotonic() when the comparison began) counts the calibration
    into --budget_minutes."""
    out.mkdir(parents=True, exist_ok=True)
    if c.period_ratio:
        c, regime = _shape_job_b(c, out, bandwidth, regime)
    c = _fit_budget(c, regime, bandwidth, started)
    drift = _probes_drift(c, bandwidth)
    start = calibrate.drift_probe(c, out, bandwidth, "start") if drift else None
    stats, cluster_info, trial_settings = _run_trials(c, out, bandwidth, regime)
    end = calibrate.drift_probe(c, out, bandwidth, "end") if start else None
    regime = dataclasses.replace(regime, bandwidth_mbit=bandwidth, drift_probe=(
        {"bandwidth_mbit": bandwidth, "start": start, "end": end} if start and end else None))
    per_trial = [bounds.judge(summary.summarise(
        s, c.warmup_steps, {"trial": trial, "order": list(s), **trial_settings[trial]},
        regime)) for trial, s in enumerate(stats)]
    achieved = trials.spread([trials.comm_to_compute(t) for t in per_trial])
    per_trial = regime_lib.judge(per_trial, regime.comm_to_compute_asked,
                                 regime.period_ratio_asked)
    result = dataclasses.replace(
        trials.combine(per_trial),
        settings={**vars(c), "bandwidth_mbit": bandwidth, "cluster": cluster_info},
        order_design=trials.order_design(settings.scenario_names(c), c.trials),
        regime=dataclasses.replace(regime, achieved_comm_to_compute=achieved))
    result = planning.plan_trials(result)
    result.to_json(out / "compare.json")
    table = report.markdown(result)
    (out / "compare.md").write_text(table)
    _attribute(result, out, c.jobs)
    shown = stats[result.representative_trial]
    leased = next((shown[n] for n in (registry.CROSSOVER, registry.PRIORITY)
                   if n in result.scenarios), None)
    if leased:
        report.plot(result, leased, str(out / "compare.png"))
    print(table)
    for check in result.checks:
        logging.warning("check failed: %s", check)
    raise_if_nothing_measured(result, c.scenarios)
    if started is not None:
        print(f"Took {(time.monotonic() - started) / 60:.1f} min"
              + (f" (estimated {c.estimated_s / 60:.0f})" if hasattr(c, "estimated_s") else ""))
    print(f"results: {out / 'compare.json'}, {out / 'compare.md'}, {out / 'compare.png'}; "
          f"tensorboard --logdir {out / 'tensorboard'}")
    return result


def _attribute(result: Comparison, out: pathlib.Path, jobs: int) -> None:
    """attribution.json/.md of the crossed round: crossover's, and crossover_turn's (in
    attribution_turn.*) when it ran; pairs only."""
    from experiments.analysis import attribute
    for scenario, name in ((registry.CROSSOVER, "attribution"),
                           (registry.CROSSOVER_TURN, "attribution_turn")):
        if scenario not in result.scenarios or jobs != 2:
            continue
        try:
            attribution = attribute.from_comparison(result, out_dir=out, scenario=scenario)
        except ValueError as err:  # e.g. the jobs did not overlap for a whole step
            logging.warning("no attribution of the %s round: %s", scenario, err)
        else:
            config_lib.write_results(out, name, attribution, attribute.markdown(attribution))


def raise_if_nothing_measured(result: Comparison, asked: Sequence[str]) -> None:
    """A comparison whose concurrent scenarios were all invalid in every trial measured
    nothing: it fails, loudly, after writing what it saw (compare.md says why)."""
    concurrent = [n for n in asked if n in registry.CONCURRENT]
    measured = [n for n in concurrent for t in result.per_trial if n in t.scenarios]
    if concurrent and not measured:
        reasons = "; ".join(f"{n}: {r[0].reason}" for n, r in result.invalid.items())
        raise RuntimeError(f"no concurrent scenario ran long enough to measure ({reasons})")


def _share(c: Any, started: float, index: int, count: int, **changes: Any) -> Any:
    """The settings of a sweep's point `index` of `count` (with `changes`), given an equal
    share of what is left of --budget_minutes (`started`: time.monotonic() at its start)."""
    if c.budget_minutes:
        left = c.budget_minutes - (time.monotonic() - started) / 60
        changes["budget_minutes"] = max(left / (count - index), 1e-3)
    return types.SimpleNamespace(**{**vars(c), **changes})


def link_and_regime(c: Any, out: pathlib.Path) -> tuple[float | None, Regime]:
    """The comparison's link and regime: --bandwidth_mbit as given (fixed), else calibrated
    to --comm_to_compute (calibrate.py); with the comm probes' costs either way."""
    if c.bandwidth_mbit is not None:
        costs = measure_comm_costs(c, out, c.bandwidth_mbit, None)
        return c.bandwidth_mbit, Regime(None, "fixed", None, **costs)
    bandwidths, record = calibrate.calibrate(c, out, [c.comm_to_compute])
    bandwidth = bandwidths[c.comm_to_compute]
    costs = measure_comm_costs(c, out, bandwidth, record)
    return bandwidth, Regime(c.comm_to_compute, "calibrated", record, **costs)


def run_period_sweep(c: Any, out: pathlib.Path, ratios: Sequence[float], started: float
                     ) -> dict[str, Any]:
    """The shift experiment (issue 50): one link and regime (link_and_regime), then the
    comparison with job B shaped to each T_B/T_A in <out>/period_<r> (the planner's call
    made before each one's trials), each within an equal share of what is left of
    --budget_minutes; writes shift.{json,md}, the one table of scenario / naive, measured
    and predicted."""
    bandwidth, regime = link_and_regime(c, out)
    rows = [shift_experiment.row(compare_at(
        _share(c, started, index, len(ratios), period_ratio=ratio), out / f"period_{ratio:g}",
        bandwidth, regime, time.monotonic())) for index, ratio in enumerate(ratios)]
    result = {"regime": regime.to_dict(), "rows": rows}
    table = shift_experiment.markdown(rows)
    config_lib.write_results(out, "shift", result, table)
    print(table)
    print(f"Took {(time.monotonic() - started) / 60:.1f} min; the shift experiment: "
          f"{out / 'shift.json'}, {out / 'shift.md'}")
    return result


def run_sweep(c: Any, out: pathlib.Path, ratios: Sequence[float], started: float
              ) -> dict[str, Any]:
    """One calibration (every ratio checked reachable before any comparison), then the
    comparison at each ratio in <out>/ratio_<r>, each within an equal share of what is left of
    --budget_minutes (`started`: time.monotonic() when the sweep began); writes
    sweep.{json,md,png}."""
    bandwidths, record = calibrate.calibrate(c, out, ratios)
    # One probe at the middle bandwidth: the CPU cost is per second and per MB, the link
    # contention a ratio of times.
    middle = sorted(bandwidths.values())[len(bandwidths) // 2]
    costs = measure_comm_costs(c, out, middle, record)
    rows = []
    for index, ratio in enumerate(ratios):  # each ratio gets an equal share of what is left
        rows.append(sweep.row(compare_at(_share(c, started, index, len(ratios)),
                                         out / f"ratio_{ratio:g}", bandwidths[ratio],
                                         Regime(ratio, "calibrated", record, **costs),
                                         time.monotonic())))
    result = {"calibration": record, "rows": rows}
    (out / "sweep.json").write_text(json.dumps(result, indent=2))
    table = sweep.markdown(rows)
    (out / "sweep.md").write_text(table)
    sweep.plot(rows, str(out / "sweep.png"))
    print(table)
    print(f"sweep: {out / 'sweep.json'}, {out / 'sweep.md'}, {out / 'sweep.png'}")
    return result
