"""Markdown table and PNG figure of a comparison (what compare.py prints and writes)."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from crossover_tf_planner import registry
from crossover_tf_planner.compare_record import (Comparison, IdealRound, ScenarioResult, Spread,
                                             Trial)
from crossover_tf_planner.job_stats import JobStats
from experiments.analysis import (attribute, intervals, machine_speed, planner_errors, planning,
                                  shift_table, steal)
from experiments.analysis import regime as regime_lib
from experiments.comparison import trials

JOB_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple")


def job_names(result: Comparison) -> list[str]:
    """The comparison's jobs, from its solo scenarios (A, B, ...)."""
    return sorted(n.removeprefix(registry.SOLO_PREFIX) for n in result.scenarios
                  if registry.is_solo(n))


def scenario_order(result: Comparison) -> list[str]:
    """Solo runs first, then sequential and the concurrent scenarios that ran."""
    names = [registry.solo(job) for job in job_names(result)] + list(registry.SCENARIOS)
    return [n for n in names if n in result.scenarios]


def with_spread(spread: Spread | Mapping[str, Any] | float, digits: int = 3) -> str:
    """"median [min–max]" of a spread (a record, or one as a sweep row saved it), or a plain
    value (a single trial)."""
    if isinstance(spread, Mapping):
        spread = Spread.from_dict(spread)
    if not isinstance(spread, Spread):
        return f"{spread:.{digits}f}"
    # Fewer values than trials: the others' scenarios were invalid (see "Invalid" below).
    count = (f" ({len(spread.values)} of {spread.of_trials} trials)"
             if spread.of_trials is not None else "")
    if spread.min == spread.max:
        return f"{spread.median:.{digits}f}{count}"
    return f"{spread.median:.{digits}f} [{spread.min:.{digits}f}–{spread.max:.{digits}f}]{count}"


def _trial_label(trial: int | None) -> str:
    return "" if trial is None else f" (trial {trial})"


INVALID_HEADING = "**Invalid scenarios** (left out of every ratio, the verdict and the plot):"
BOUNDS_HEADING = ("**Outside the sanity bounds** (the trial's sequential run left out of every "
                  "ratio over it, the ideal, measured / ideal, the verdict and the plot; its "
                  "ratios among concurrent scenarios stay):")
REGIME_HEADING = ("**Out of the regime** (the trial's solo runs more than "
                  f"±{regime_lib.TOLERANCE:.0%} off the asked-for M/C: its ratios left out of "
                  "the calls; its tables stay, and the regime table below shows it):")


def _invalid_lines(result: Comparison) -> list[str]:
    """Scenarios refused for a window too short to measure; apart from them, trials whose
    sequential run broke a sanity bound (analysis/bounds.py: their ratios among concurrent
    scenarios still count) and trials out of the regime (analysis/regime.judge); and failed
    sanity checks: said where the numbers are, so nobody reads a table without them."""
    apart = {registry.SEQUENTIAL: BOUNDS_HEADING, registry.OUT_OF_REGIME: REGIME_HEADING}
    lines = []
    for heading, entries in (
            (INVALID_HEADING, {n: r for n, r in result.invalid.items() if n not in apart}),
            *((h, {n: result.invalid[n]}) for n, h in apart.items() if n in result.invalid)):
        if entries:
            lines += ["", heading, ""]
            lines += [f"- {name}{_trial_label(e.trial)}: {e.reason}"
                      for name, runs in entries.items() for e in runs]
    lines += [f"\n**Check failed:** {check}" for check in result.checks]
    return lines


def _regime_lines(result: Comparison) -> list[str]:
    """Which M/C was asked for, which bandwidth gave it, and what the solo runs achieved."""
    regime = result.regime
    if not regime:
        return []
    asked = regime.comm_to_compute_asked
    source = regime.bandwidth_source
    if not result.settings.get("cluster", {}).get("emulated", True):
        source += ", NOT applied: localhost fallback"
    lines = ["", "| regime | value |", "|---|---:|",
             f"| M/C asked for | {'—' if asked is None else f'{asked:g}'} |",
             f"| M/C achieved (solo runs) | {with_spread(regime.achieved_comm_to_compute)} |",
             f"| bandwidth (Mbit/s, {source}) | {regime.bandwidth_mbit:.4g} |"]
    cycle = result.settings.get("cluster", {}).get("horovod_cycle_time_ms")
    if cycle is not None:
        lines.append(f"| Horovod cycle time (ms, every rank: HOROVOD_CYCLE_TIME) | {cycle:g} |")
    contention = regime.link_contention
    if contention:
        lines += [f"| link's shared efficiency (allreduces overlapping at random) | "
                  f"{contention['shared_efficiency']:.3f} |",
                  f"| allreduce slowdown beside a busy core | "
                  f"{contention['compute_slowdown']:.3f} |"]
    return lines


def _scenario_table(result: Comparison, jobs_all: list[str], header: str,
                    rate: Callable[[ScenarioResult, str], float | None],
                    with_aggregate: bool) -> list[str]:
    """One row per scenario: each job's rate (`rate(scenario, job)`, None: not in it) and,
    where the per-job columns add up to it, the aggregate."""
    lines = [f"| {header} | " + " | ".join(f"job {j} images/s" for j in jobs_all)
             + (" | aggregate images/s |" if with_aggregate else " |"),
             "|---|" + "---:|" * (len(jobs_all) + with_aggregate)]
    for name in scenario_order(result):
        scenario = result.scenarios[name]
        cells = [f"{value:.1f}{_priority_mark(scenario.jobs[j].priority)}"
                 if (value := rate(scenario, j)) is not None else "" for j in jobs_all]
        aggregate = f" {scenario.aggregate_images_per_s:.1f} |" if with_aggregate else ""
        lines.append(f"| {name} | {' | '.join(cells)} |{aggregate}")
    return lines


def _windowed(scenario: ScenarioResult, job: str) -> float | None:
    """A job's rate inside the scenario's measurement (per_job_in_aggregate): the concurrent
    window for a concurrent scenario, its share of the aggregate for sequential."""
    return (scenario.per_job_in_aggregate or {}).get(job)


def _whole_run(scenario: ScenarioResult, job: str) -> float | None:
    """A job's rate over its own whole timed run (stats.json's images_per_s)."""
    return scenario.jobs[job].images_per_s if job in scenario.jobs else None


WINDOWED_NOTE = ("Every column is measured on the same steps: a concurrent scenario's inside "
                 "the window in which all its jobs ran timed steps (steps cut by its edges "
                 "counted by their fraction), sequential's per-job columns each job's share of "
                 "the aggregate; per-job columns add up to the aggregate.")
WHOLE_RUN_NOTE = ("Each job's rate over its own whole timed run (including any time it ran "
                  "alone); not the rates the ratios use.")


def _order_lines(result: Comparison) -> list[str]:
    """What the trials' orders balanced, said where a reader weighs the spread."""
    design = result.order_design
    if not design or design.trials < 2:
        return []
    if design.adjacency_balanced:
        what = "each scenario in each position, and after each other, equally often"
    elif design.positions_balanced:
        what = (f"each scenario in each position equally often; which scenario runs just "
                f"before which is not balanced (needs a multiple of {design.rows} trials)")
    else:
        what = (f"positions are NOT balanced: {design.trials} trials is not a multiple of "
                f"the scenario count, so some scenarios ran early or late more often "
                f"(a multiple of {design.rows} trials balances positions and neighbours)")
    return ["", f"Order: rows of a Williams design, one per trial; {what}."]


def _ratio_lines(result: Comparison, n_trials: int) -> list[str]:
    """The ratio table: median [min–max] over trials, and the bootstrap 95% interval with the
    call it makes (intervals.call) for every ratio of two scenarios."""
    spreads: Mapping[str, Spread | float] = result.ratio_spread or result.ratios
    found = result.ratio_interval
    header = f"median [min–max] of {n_trials} trials" if n_trials > 1 else "value"
    lines = ["", f"| ratio | {header} | 95% interval (call) |", "|---|---:|---:|"]
    over_ideal = {metric.key for metric in registry.OVER_IDEAL.values()}
    lines += [f"| {row.label} | {with_spread(spreads[row.key])}{_left_out(result, row.key)} | "
              f"{intervals.describe(found.get(row.key), judge=_judge(row.key in over_ideal))} |"
              for row in registry.TABLE if row.key in spreads]
    if found:
        method = next(iter(found.values())).method
        lines += ["", f"Intervals: {method}. A ratio whose interval includes 1.0 is a tie."]
    if result.ideal is not None and registry.IDEAL.key in spreads:
        lines += ["", ideal_note(result.ideal)]
    return lines


def _left_out(result: Comparison, key: str) -> str:
    """Said in the ratio's own cell: the trials a failed check left out of it (trials.combine),
    so the median, range and interval beside it are read as what they are."""
    left = result.left_out.get(key)
    if not left:
        return ""
    return f"; {', '.join(f'trial {i}' for i in left)} left out: its check failed (above)"


def _judge(of_ideal: bool) -> Callable[[float, float], str]:
    """How a row's interval is read: a measured / ideal against the bound, else a call."""
    return intervals.ideal_call if of_ideal else intervals.call


IDEAL_NOTE = (
    "Ideal: one step of each job per round, the round no shorter than any resource it needs "
    "(solo runs' mean times per step, the statistic the measured rates use): the device "
    "(every job's compute + apply), the link (every job's allreduce, one after another) and "
    "each job's own solo step; over the measured sequential rate. An upper bound: "
    "it grants no hand-off cost and no allreduce slowed by a busy core or a shared link, so "
    "a measured / ideal whose interval lies wholly above 1 is flagged.")


def ideal_note(ideal: IdealRound) -> str:
    """IDEAL_NOTE and what bounds the representative trial's ideal round."""
    bounds = ", ".join(f"{name} {1e3 * s:.1f}" for name, s in ideal.bounds_s.items())
    core = ("" if ideal.core_s is None else
            f" The core's CPU estimate (device holds plus each allreduce's CPU from the "
            f"comm-CPU probe), {1e3 * ideal.core_s:.1f} ms, is not a bound: crossed jobs have "
            "run faster than it (experiments/analysis/ideal.py).")
    return (f"{IDEAL_NOTE} Here the {ideal.bound_by} sets the ideal round: {bounds} ms per "
            f"round.{core}")


def _verdict_lines(result: Comparison, n_trials: int) -> list[str]:
    """The verdict over all trials: the planner's one recommendation (planning.recommendation,
    printed here only; the planner's block names its inputs) and the measured winner, with the
    rule it follows on the next line."""
    recommended, winner = trials.verdict_cells(trials.verdict(result))
    counted = regime_lib.in_regime_count(result)
    within = (["", f"Trials in the regime: {counted[0]} of {counted[1]} within "
                   f"±{regime_lib.TOLERANCE:.0%} of the asked-for M/C"
                   + regime_lib.calls_basis(result)]
              if counted is not None and counted[1] > 1 else [])
    return [f"Over all {n_trials} trial(s): recommended **{recommended}**; measured winner: "
            f"**{winner}**.", *within, "", trials.VERDICT_RULE]


def markdown(result: Comparison | Trial) -> str:
    """Per-job and aggregate throughput per scenario (all inside the measured window; the
    whole-run rates in their own table), the ratios (median [min–max] over trials when there
    are several, and the bootstrap interval), the regime, each job's solo C and M, the
    planner's check and the verdict with its rule."""
    if isinstance(result, Trial):
        result = Comparison.of_trial(result)
    n_trials = result.trials
    shown = (f" (trial {result.representative_trial}: median crossover / naive)"
             if n_trials > 1 else "")
    jobs_all = job_names(result)
    lines = [WINDOWED_NOTE, "", *_scenario_table(result, jobs_all, f"scenario{shown}", _windowed,
                                                  True)]
    lines += ["", WHOLE_RUN_NOTE, "",
              *_scenario_table(result, jobs_all, "scenario (whole run)", _whole_run, False)]
    lines += _invalid_lines(result)
    lines += _ratio_lines(result, n_trials)
    lines += _order_lines(result)
    lines += _regime_lines(result)
    lines += ["", "| job | compute C (ms) | comm M (ms) | solo step (ms) |", "|---|---:|---:|---:|"]
    for job in jobs_all:
        solo = result.scenarios[registry.solo(job)].jobs[job]
        lines.append(f"| {job} | {1e3 * solo.device_s:.1f} | {1e3 * solo.comm_s:.1f} | "
                     f"{1e3 * solo.step_time_s:.1f} |")
    speed = machine_speed.speed_line(result, machine_speed.load_reference())
    if speed:
        lines += ["", speed]
    lines += regime_lib.drift_lines(result) + regime_lib.drift_probe_lines(result)
    lines += steal.steal_lines(result)
    lines += shift_table.shift_lines(result)
    if result.planner is not None:
        lines += _planner_lines(result, result.planner)
    if {registry.NAIVE_OVER_SEQUENTIAL.key, registry.CROSSOVER_OVER_NAIVE.key} <= set(
            result.ratios) or planning.recommendation(result) is not None:
        lines += ["", *_verdict_lines(result, n_trials)]
    return "\n".join(lines) + "\n"


PLANNER_HEADING = (
    "Planner (from the solo runs and the comm-CPU and link-contention probes; the solo runs "
    "are trial {trial}'s, the trial the tables above show. Its recommendation is computed once, "
    "from {inputs}, and given once, in the verdict below; here its predictions are checked "
    "against trial {trial} alone):")


def _planner_lines(result: Comparison, planner: Mapping[str, Any]) -> list[str]:
    """The planner's block: the inputs of its one recommendation (printed once, in the
    verdict), then the checks of its predictions: against the shown trial, each trial's
    error, and each trial's own pick against that trial's measured winner."""
    from crossover_tf_planner import validate
    solo_runs = planner.get("recommendation", {}).get("solo_runs")
    inputs = "these" if not solo_runs else (
        "each job's median solo run over the trials checked below (" + ", ".join(
            f"{job}: trial {trial}'s" for job, trial in solo_runs.items()) + ") and the probes")
    lines = ["", PLANNER_HEADING.format(trial=result.representative_trial, inputs=inputs), "",
             validate.to_markdown(planner, recommendation=False)]
    lines += planner_errors.markdown(result, planner.get("device_model", "cpu"))
    return lines + planner_errors.winner_checks(result)


def _priority_mark(priority: str) -> str:
    """" (primary)" / " (secondary)" after a job that ran with a lease priority."""
    return "" if priority == "normal" else f" ({priority})"


def plot(result: Comparison | Trial, leased: Mapping[str, JobStats], path: str,
         max_steps: int = 8) -> None:
    """Left: throughput bars per scenario (stacked by job, the median trial) with every trial's
    aggregate as a dot. Middle: each ratio's per-trial values and median with min–max bars.
    Right: host 0's lease timeline in the leased run (crossover, else priority), showing each
    job's compute over the others' communication, with each job's priority in its label."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if isinstance(result, Trial):
        result = Comparison.of_trial(result)
    fig, (bars, ratios, lanes) = plt.subplots(1, 3, figsize=(17, 4.5),
                                              gridspec_kw={"width_ratios": [1, 0.8, 1.6]})
    _throughput_panel(bars, result)
    _ratio_panel(ratios, result)
    _timeline_panel(lanes, leased, max_steps)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _throughput_panel(ax: Any, result: Comparison) -> None:
    names = scenario_order(result)
    bottom = np.zeros(len(names))
    for job, color in zip(job_names(result), JOB_COLORS):
        values = np.array([(result.scenarios[n].per_job_in_aggregate or {}).get(job, 0.0)
                           for n in names])
        ax.bar(names, values, bottom=bottom, color=color, label=f"job {job}")
        bottom += values
    for trial in result.per_trial:
        ax.plot(names, [t.aggregate_images_per_s if (t := trial.scenarios.get(n)) else np.nan
                        for n in names], "k.",
                label="each trial" if trial is result.per_trial[0] else None)
    ax.set_ylabel("images/s (aggregate, stacked by job)")
    ax.set_title("throughput")
    ax.legend()
    ax.tick_params(axis="x", rotation=20)


def spreads_of(result: Comparison) -> dict[str, Spread]:
    """Each ratio's spread over trials (a single trial's value as a spread of one)."""
    return result.ratio_spread or {k: trials.spread([v]) for k, v in result.ratios.items()}


def _ratio_panel(ax: Any, result: Comparison) -> None:
    spreads = spreads_of(result)
    keys = [r.key for r in registry.PLOTTED if r.key in spreads]
    for i, key in enumerate(keys):
        s = spreads[key]
        below, above = s.median - s.min, s.max - s.median
        ax.errorbar([i], [s.median], yerr=[[below], [above]], fmt="o", color="tab:red",
                    capsize=6, label="median [min–max]" if not i else None)
        ax.plot([i] * len(s.values), s.values, "k.",
                label="each trial" if not i else None)
        interval = result.ratio_interval.get(key)
        if interval:
            ax.plot([i + 0.15] * 2, [interval.low, interval.high], color="tab:blue",
                    linewidth=3, alpha=0.6, label="95% interval" if not i else None)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks(range(len(keys)), [k.replace("_over_", " /\n") for k in keys])
    ax.tick_params(axis="x", rotation=30, labelsize=8)  # five two-line labels in a narrow panel
    ax.set_title(f"ratios over {result.trials} trial(s)")
    ax.legend()


def _timeline_panel(ax: Any, leased: Mapping[str, JobStats], max_steps: int) -> None:
    """Each job's lease holds over its last `max_steps` steps (every micro-batch its own bar;
    stats without raw events fall back to the step phases) and its allreduces, one pair of
    lanes per job, labelled with the job's priority."""
    lanes = {}
    for job, stats in leased.items():
        phases = np.asarray(stats.phases_ns, dtype=np.int64).reshape(-1, 5)[-max_steps:]
        if not len(phases):
            continue
        events = attribute.lease_events(stats)
        events = events[(events[:, 1] >= phases[0, 0]) & (events[:, 2] > 0)]
        lanes[job] = (events[:, 1:3], phases[:, 1:3])
    if not lanes:
        return
    origin = min(min(h[:, 0].min(), c[:, 0].min()) for h, c in lanes.values())
    rows = []
    for (job, (holds, comms)), color in zip(lanes.items(), JOB_COLORS):
        mark = _priority_mark(leased[job].priority)
        for label, spans, face in ((f"{job}{mark} device", holds, color),
                                   (f"{job} allreduce", comms, "lightgray")):
            rows.append((label, [((a - origin) / 1e6, (b - a) / 1e6) for a, b in spans], face))
    for i, (label, spans, color) in enumerate(rows):
        ax.broken_barh(spans, (i - 0.4, 0.8), facecolors=color, edgecolor="black",
                       linewidth=0.3)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ms (host 0, last steps of the leased run)")
    ax.set_title("device lease timeline: each job's compute crossed with the others' allreduce")
