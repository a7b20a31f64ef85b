"""One comparison at one bandwidth: every scenario in every trial, each trial's summary held to
the sanity bounds, the summaries combined, the planner's check, and compare.{json,md,png} with
the attribution of the crossed rounds; and the sweep of such comparisons over M/C."""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Sequence

from absl import logging

from crossover_tf_planner import registry
from crossover_tf_planner.compare_record import Comparison, Regime
from crossover_tf_planner.job_stats import JobStats
from experiments import config as config_lib
from experiments.analysis import bounds, planning, report, sweep
from experiments.comparison import calibrate, scenarios, settings, summary, trials
from experiments.probes.comm_costs import measure_comm_costs

TrialStats = dict[str, dict[str, JobStats]]  # scenario -> job -> stats, of one trial


def _run_trials(c: Any, out: pathlib.Path, bandwidth: float | None
                ) -> tuple[list[TrialStats], dict[str, Any]]:
    """Every scenario `c.trials` times on one cluster, in the orders of a Williams design
    (trials.trial_orders)."""
    stats: list[TrialStats] = []
    with calibrate.cluster(c, bandwidth) as cluster:
        cluster_info = cluster.describe()
        for trial, order in enumerate(trials.trial_orders(settings.scenario_names(c), c.trials)):
            stats.append({name: scenarios.run_scenario(cluster, c, name, out, f"t{trial}_{name}",
                                                       jobs=scenarios.job_names(c.jobs))
                          for name in order})
    return stats, cluster_info


def compare_at(c: Any, out: pathlib.Path, bandwidth: float | None, regime: Regime
               ) -> Comparison:
    """Runs the trials at one bandwidth; writes compare.{json,md,png} in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    stats, cluster_info = _run_trials(c, out, bandwidth)
    regime = dataclasses.replace(regime, bandwidth_mbit=bandwidth)
    per_trial = [bounds.judge(summary.summarise(s, c.warmup_steps,
                                                {"trial": trial, "order": list(s)}, regime))
                 for trial, s in enumerate(stats)]
    result = dataclasses.replace(
        trials.combine(per_trial),
        settings={**vars(c), "bandwidth_mbit": bandwidth, "cluster": cluster_info},
        order_design=trials.order_design(settings.scenario_names(c), c.trials),
        regime=dataclasses.replace(regime, achieved_comm_to_compute=trials.spread(
            [trials.comm_to_compute(t) for t in per_trial])))
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


def run_sweep(c: Any, out: pathlib.Path, ratios: Sequence[float]) -> dict[str, Any]:
    """One calibration (every ratio checked reachable before any comparison), then the
    comparison at each ratio in <out>/ratio_<r>; writes sweep.{json,md,png}."""
    bandwidths, record = calibrate.calibrate(c, out, ratios)
    # One probe at the middle bandwidth: the CPU cost is per second and per MB, the link
    # contention a ratio of times.
    middle = sorted(bandwidths.values())[len(bandwidths) // 2]
    costs = measure_comm_costs(c, out, middle, record)
    rows = [sweep.row(compare_at(c, out / f"ratio_{ratio:g}", bandwidths[ratio],
                                 Regime(ratio, "calibrated", record, **costs)))
            for ratio in ratios]
    result = {"calibration": record, "rows": rows}
    (out / "sweep.json").write_text(json.dumps(result, indent=2))
    table = sweep.markdown(rows)
    (out / "sweep.md").write_text(table)
    sweep.plot(rows, str(out / "sweep.png"))
    print(table)
    print(f"sweep: {out / 'sweep.json'}, {out / 'sweep.md'}, {out / 'sweep.png'}")
    return result
