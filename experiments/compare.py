"""Side-by-side comparison on one emulated cluster: solo, sequential, naive, crossover.

  python -m experiments.compare                               # README's main job
  python -m experiments.compare --comm_to_compute=2 --trials=3
  python -m experiments.compare --sweep_comm_to_compute=0.5,1,2 --trials=3
  python -m experiments.compare --bandwidth_mbit=100 --model=resnet20   # fixed link, no calibration
  python -m experiments.compare --jobs=3 --comm_to_compute=2 --trials=3  # three jobs crossing
  python -m experiments.compare --scenarios=sequential,naive,priority    # primary + secondary
  python -m experiments.compare --scenarios=sequential,naive,naive_env,crossover,crossover_env \
      --scenario_env=HOROVOD_CYCLE_TIME=5 --trials=3         # a runtime setting side by side

--jobs identical-shaped jobs A, B, ... (2 by default, up to 4; one rank per emulated host each)
are run with the same model, data and settings as:
  sequential  one job after another (each alone: these runs are also the solo profiles,
              measured with a lease nobody contends, which records each step's compute C and
              allreduce M)
  naive       all jobs at the same time, no lease (device and link simply shared)
  crossover   all jobs at the same time, sharing a device lease per host (FIFO turns)
  naive_env, crossover_env  (opt-in) naive and crossover with --scenario_env in every
              rank's environment (e.g. HOROVOD_CYCLE_TIME=5), in the same interleaved trials:
              a runtime setting measured side by side with the plain scenarios
  crossover_turn  (opt-in) crossover whose jobs also take link turns: one gradient allreduce
              at a time per host, in one global order (crossover_tf.lease.link_turn)
  priority    (opt-in, 2 jobs) A as the primary, B as a secondary computing in
              --secondary_micro_batches micro-batches, sharing the lease: A's throughput
              against solo, B's against naive, A's worst wait against B's micro-batch

Regime: crossing pays according to M/C, and C depends on the machine. Unless --bandwidth_mbit
fixes the link, two short solo runs at two bandwidths fit M(B) = m0 + k/B (calibration.py) and
the comparison runs at the bandwidth that gives --comm_to_compute; compare.json records the
asked-for and the achieved M/C. --trials repeats every scenario, in the orders of a Williams
design (trials.py), and reports the median with min/max of every ratio and its bootstrap 95%
interval (intervals.py), which the verdict rests on. --sweep_comm_to_compute runs the
calibrated comparison at several ratios (one sub-directory each) and writes sweep.{json,md,png}.

The table, JSON, markdown and PNG land in --out_dir; TensorBoard runs of every scenario land
under <out_dir>/tensorboard/t<trial>_<scenario>/<job>.
"""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import statistics
from typing import Any, Mapping, Sequence

from absl import app, flags, logging

from crossover_tf_planner.job_stats import JobStats
from crossover_tf_planner.policies import MEASURED
from experiments import calibration, report, scenarios, sweep, throughput, trials
from experiments import config as config_lib

FLAG_NAMES = ["model", "dataset", "global_batch_size", "steps", "warmup_steps", "learning_rate",
              "jit_compile", "bandwidth_mbit", "latency_ms", "num_hosts", "out_dir",
              "timeout_s", "force_localhost", "scenarios", "comm_to_compute", "trials",
              "sweep_comm_to_compute", "calibration_mbit", "calibration_timed_steps", "jobs",
              "secondary_micro_batches", "comm_cpu_probe", "contention_probe_seconds",
              "horovod_timelines", "scenario_env"]
SCENARIOS = ("sequential", *scenarios.CONCURRENT)  # the first trial's order
MAX_TRIALS = 20
MAX_SWEEP_POINTS = 8


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines this script's flags on flag_values, once; training flags are train.py's own
    and cluster flags launch_pair.py's, with the comparison's defaults."""
    if "scenarios" in flag_values:
        return
    from experiments import launch_pair, train
    train.define_flags(flag_values)  # model, dataset, global_batch_size, steps, ...
    launch_pair.define_flags(flag_values)  # bandwidth_mbit, latency_ms, num_hosts, ...
    for name, default in (("model", "resnet20"), ("dataset", "synthetic:cifar10"),
                          ("global_batch_size", 128), ("steps", 40), ("warmup_steps", 10),
                          ("timeout_s", 900.0)):
        flag_values.set_default(name, default)
    define = config_lib.flag_definer(flag_values)
    define(flags.DEFINE_string, "out_dir", "runs/compare",
           "Where results and TensorBoard logs go.")
    define(flags.DEFINE_list, "scenarios", list(MEASURED),
           f"Scenarios to run, of {', '.join(SCENARIOS)} (sequential is needed: it provides "
           "the solo profiles).")
    define(flags.DEFINE_integer, "jobs", 2,
           f"Jobs sharing the hosts (2..{len(scenarios.JOB_NAMES)}), named A, B, ...")
    define(flags.DEFINE_integer, "secondary_micro_batches", 4,
           "Priority scenario: micro-batches per step of the secondary job (B).")
    define(flags.DEFINE_boolean, "horovod_timelines", False,
           "Profiling only: write every job's Horovod timeline (rank 0) next to its stats.json; "
           "attribution.md then splits each allreduce into waiting for the other ranks and the "
           "transfer. Horovod's timeline writer thread spins (a yield loop), taking much of a "
           "CPU device: the throughput numbers of such a run are not comparable.")
    define(flags.DEFINE_list, "scenario_env", [],
           "KEY=VALUE environment for every rank of the naive_env and crossover_env scenarios "
           "(e.g. HOROVOD_CYCLE_TIME=5): a runtime setting measured side by side with naive "
           "and crossover.")
    define(flags.DEFINE_boolean, "comm_cpu_probe", True,
           "Measure what an allreduce costs the shared CPU core and what the link loses "
           "to allreduces overlapping at random (about 2 minutes, comm_cpu.py) for the "
           "planner's prediction.")
    define(flags.DEFINE_float, "contention_probe_seconds", 20.0,
           "How long the link contention probe times one job alone (two jobs: twice that).")
    define(flags.DEFINE_float, "comm_to_compute", 1.0,
           "Asked-for M/C (allreduce over device time per step); the link bandwidth is "
           "calibrated to give it unless --bandwidth_mbit is set.")
    define(flags.DEFINE_integer, "trials", 1,
           f"Runs of every scenario (1..{MAX_TRIALS}), in the orders of a Williams design: a "
           "multiple of the scenario count balances positions (compare.md says when not).")
    define(flags.DEFINE_list, "sweep_comm_to_compute", [],
           f"M/C ratios (up to {MAX_SWEEP_POINTS}) to run the calibrated comparison at; "
           "writes sweep.{json,md,png}.")
    define(flags.DEFINE_float, "calibration_mbit", 100.0,
           "First calibration bandwidth (the next ones are chosen from the results).")
    define(flags.DEFINE_integer, "calibration_timed_steps", 20,
           "Timed steps (after --warmup_steps) of each solo calibration run.")


def sweep_ratios(c: Any) -> list[float]:
    """--sweep_comm_to_compute as floats (a clear error for anything else)."""
    try:
        return [float(r) for r in c.sweep_comm_to_compute]
    except (TypeError, ValueError):
        raise ValueError(f"sweep_comm_to_compute must be numbers, got "
                         f"{c.sweep_comm_to_compute!r}") from None


def _attribute(result: Mapping[str, Any], out: pathlib.Path, jobs: int) -> None:
    """attribution.json/.md of the crossed round: crossover's, and crossover_turn's (in
    attribution_turn.*) when it ran; pairs only."""
    from experiments import attribute
    for scenario, name in (("crossover", "attribution"), ("crossover_turn", "attribution_turn")):
        if scenario not in result["scenarios"] or jobs != 2:
            continue
        try:
            attribution = attribute.from_comparison(result, out_dir=out, scenario=scenario)
        except ValueError as err:  # e.g. the jobs did not overlap for a whole step
            logging.warning("no attribution of the %s round: %s", scenario, err)
        else:
            config_lib.write_results(out, name, attribution, attribute.markdown(attribution))


def validate(c: Any) -> None:
    scenarios.train_command(c, "A", "", "", "")  # train.py validates the ranks' settings
    config_lib.require(c.bandwidth_mbit is None or c.bandwidth_mbit > 0,
                       "bandwidth_mbit must be positive")
    config_lib.require(c.num_hosts >= 2, "num_hosts must be >= 2: one host has no network")
    config_lib.require(c.global_batch_size % c.num_hosts == 0,
                       "global_batch_size must be divisible by num_hosts")
    config_lib.require(c.steps - c.warmup_steps >= 10, "need at least 10 timed steps")
    config_lib.require(c.contention_probe_seconds >= 2.0,
                       "contention_probe_seconds must be >= 2 (the probe's shortest run)")
    unknown = sorted(set(c.scenarios) - set(SCENARIOS))
    config_lib.require(not unknown, f"unknown scenarios {unknown}; choose from {SCENARIOS}")
    config_lib.require("sequential" in c.scenarios,
                       "the sequential scenario is required (it gives the solo profiles)")
    config_lib.require(2 <= c.jobs <= len(scenarios.JOB_NAMES),
                       f"jobs must be in 2..{len(scenarios.JOB_NAMES)}, got {c.jobs}")
    config_lib.require("priority" not in c.scenarios or c.jobs == 2,
                       "the priority scenario runs one primary and one secondary: --jobs=2")
    config_lib.require(c.secondary_micro_batches >= 1
                       and (c.global_batch_size // c.num_hosts) % c.secondary_micro_batches == 0,
                       f"secondary_micro_batches must divide each rank's batch "
                       f"({c.global_batch_size // max(c.num_hosts, 1)}), got "
                       f"{c.secondary_micro_batches}")
    env = scenarios.parse_env(c.scenario_env)
    config_lib.require(bool(env) == bool(set(scenarios.WITH_ENV) & set(c.scenarios)),
                       f"--scenario_env and the {' / '.join(scenarios.WITH_ENV)} scenarios go "
                       "together: name at least one of them and give at least one KEY=VALUE")
    config_lib.require(1 <= c.trials <= MAX_TRIALS,
                       f"trials must be in 1..{MAX_TRIALS}, got {c.trials}")
    config_lib.require(math.isfinite(c.comm_to_compute) and c.comm_to_compute > 0,
                       f"comm_to_compute must be a positive number, got {c.comm_to_compute}")
    ratios = sweep_ratios(c)
    config_lib.require(all(math.isfinite(r) and r > 0 for r in ratios),
                       f"sweep_comm_to_compute ratios must be positive, got {ratios}")
    config_lib.require(len(ratios) <= MAX_SWEEP_POINTS and len(set(ratios)) == len(ratios),
                       f"sweep_comm_to_compute takes up to {MAX_SWEEP_POINTS} distinct "
                       f"ratios, got {ratios}")
    config_lib.require(not ratios or c.bandwidth_mbit is None,
                       "sweep_comm_to_compute calibrates the bandwidth per ratio; drop "
                       "--bandwidth_mbit")
    config_lib.require(not ratios or (
        {"naive", "crossover"} <= set(c.scenarios) and c.jobs == 2),
                       "sweep_comm_to_compute compares a crossover pair with naive and "
                       "sequential: run those scenarios with --jobs=2")
    config_lib.require(c.bandwidth_mbit is not None or not c.force_localhost,
                       "calibration needs shaped links; force_localhost has none, so set "
                       "--bandwidth_mbit (it is then not applied) or drop force_localhost")
    lowest = calibration.MIN_MBIT * calibration.MIN_STEP
    config_lib.require(lowest <= c.calibration_mbit <= calibration.MAX_MBIT,
                       f"calibration_mbit must be in [{lowest:g}, {calibration.MAX_MBIT:g}], "
                       f"got {c.calibration_mbit}")
    config_lib.require(c.calibration_timed_steps >= 5,
                       f"calibration_timed_steps must be >= 5, got {c.calibration_timed_steps}")


def summarise(stats: Mapping[str, Mapping[str, JobStats]], warmup_steps: int,
              settings: Mapping[str, Any]) -> dict[str, Any]:
    """Scenario table, ratios and the ideal ratio from the per-job stats of each scenario; a
    ratio is there only when both of its scenarios ran and measured. Each measured scenario
    keeps "step_s", per job the durations of the steps it was measured on, for the bootstrap
    interval (intervals.py). A concurrent scenario
    whose window is too short (throughput.WindowGuard) is left out of the table and every
    ratio, with the reason under "invalid"."""
    seq = stats["sequential"]
    table: dict[str, Any] = {
        f"solo_{job}": {"jobs": {job: s.to_dict()}, "aggregate_images_per_s": s.images_per_s,
                        "per_job_in_aggregate": {job: s.images_per_s}}
        for job, s in seq.items()}
    sequential = throughput.sequential_aggregate(seq)
    total_images = sum(s.timed_images for s in seq.values())
    table["sequential"] = {
        "jobs": {job: s.to_dict() for job, s in seq.items()},
        "aggregate_images_per_s": sequential,
        "per_job_in_aggregate": {job: sequential * s.timed_images / total_images
                                 for job, s in seq.items()},
        "step_s": {job: throughput.timed_step_durations(s, warmup_steps)
                   for job, s in seq.items()}}
    invalid: dict[str, str] = {}
    for name in scenarios.CONCURRENT:
        if name not in stats:
            continue
        warmups = _warmups(stats[name], warmup_steps)
        try:
            aggregate, per_job, window = throughput.concurrent_aggregate(
                stats[name], warmups,
                share_exempt=[j for j, s in stats[name].items() if s.priority == "secondary"])
        except throughput.WindowTooShort as err:  # left out of every ratio below
            logging.warning("scenario %s is invalid: %s", name, err)
            invalid[name] = str(err)
            continue
        table[name] = {"jobs": {j: s.to_dict() for j, s in stats[name].items()},
                       "aggregate_images_per_s": aggregate,
                       "per_job_in_aggregate": per_job, "window_s": window,
                       "step_s": throughput.window_step_durations(stats[name], warmups)}
    agg = {n: s["aggregate_images_per_s"] for n, s in table.items()}
    ratios = {f"{top}_over_{bottom}": agg[top] / agg[bottom]
              for top, bottom in (("crossover", "sequential"), ("crossover", "naive"),
                                  ("naive", "sequential"), ("crossover_env", "crossover"),
                                  ("crossover_env", "naive"), ("naive_env", "naive"),
                                  ("crossover_env", "naive_env"), ("crossover_turn", "crossover"),
                                  ("crossover_turn", "naive"), ("crossover_turn", "sequential"))
              if top in agg and bottom in agg}
    ratios["ideal_crossover_over_sequential"] = throughput.ideal_crossover_ratio(
        list(seq.values()))
    for crossed, key in trials.OVER_IDEAL.items():
        if f"{crossed}_over_sequential" in ratios:
            ratios[key] = (ratios[f"{crossed}_over_sequential"]
                           / ratios["ideal_crossover_over_sequential"])
    if "priority" in table:
        from experiments import priority_metrics
        naive = table.get("naive", {}).get("per_job_in_aggregate")
        ratios.update(priority_metrics.priority_ratios(
            stats["priority"], seq, table["priority"]["per_job_in_aggregate"], naive,
            warmup_steps))
    return {"settings": dict(settings), "scenarios": table, "ratios": ratios,
            "invalid": invalid}


def _warmups(jobs: Mapping[str, JobStats], warmup_steps: int) -> dict[str, int]:
    """Warm-up steps left out per job: a secondary runs only in the primary's gaps, so it
    starts stepping well after the primary; only its first (compiling) step is left out, or
    the primary could finish before the secondary's warm-up does."""
    return {job: min(1, warmup_steps) if s.priority == "secondary" else warmup_steps
            for job, s in jobs.items()}


def _cluster(c: Any, bandwidth_mbit: float | None) -> Any:
    from experiments.cluster import EmulatedCluster
    return EmulatedCluster(num_hosts=c.num_hosts, bandwidth_mbit=bandwidth_mbit,
                           latency_ms=c.latency_ms, force_localhost=c.force_localhost)


def _calibration_point(c: Any, out: pathlib.Path, bandwidth: float
                       ) -> calibration.CalibrationPoint:
    """A short solo run of job A (holding an uncontended lease) on a cluster at `bandwidth`."""
    with _cluster(c, bandwidth) as cluster:
        if not cluster.is_emulated:
            raise RuntimeError(f"calibration needs the emulated, shaped cluster, but it fell back "
                               f"to localhost ({cluster.fallback_reason}); set --bandwidth_mbit")
        stats = scenarios.run_scenario(
            cluster, c, "sequential", out / "calibration", run_name=f"{bandwidth:.4g}mbit",
            jobs=("A",), steps=c.warmup_steps + c.calibration_timed_steps)["A"]
    point = calibration.CalibrationPoint(bandwidth, stats.device_s, stats.comm_s)
    logging.info("calibration at %.4g Mbit/s: C=%.1f ms, M=%.1f ms", bandwidth,
                 1e3 * point.compute_s, 1e3 * point.comm_s)
    return point


def calibrate(c: Any, out: pathlib.Path, ratios: Sequence[float]
              ) -> tuple[dict[float, float], dict[str, Any]]:
    """Solo runs at 2..MAX_POINTS bandwidths, the fit, and the bandwidth for each ratio;
    writes calibration.json first, so an unreachable ratio's error comes with its numbers."""
    target = statistics.geometric_mean(ratios)  # the points bracket the sweep's middle
    points = [_calibration_point(c, out, c.calibration_mbit)]
    while len(points) < calibration.MAX_POINTS:
        bandwidth = calibration.next_bandwidth(points, target)
        if bandwidth is None:
            break
        points.append(_calibration_point(c, out, bandwidth))
    record: dict[str, Any] = {"points": [dataclasses.asdict(p) for p in points]}
    saved = out / "calibration" / "calibration.json"
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(record, indent=2))  # kept even if the fit fails
    fit = calibration.fit_comm_model(points)
    compute_s = calibration.compute_time(points)
    record.update(fit=dataclasses.asdict(fit), compute_s=compute_s,
                  smallest_reachable_ratio=calibration.smallest_ratio(fit, compute_s))
    saved.write_text(json.dumps(record, indent=2))
    return {r: calibration.choose_bandwidth(fit, compute_s, r) for r in ratios}, record


def _run_trials(c: Any, out: pathlib.Path, bandwidth: float | None
                ) -> tuple[list[dict[str, dict[str, JobStats]]], dict[str, Any]]:
    """Every scenario `c.trials` times on one cluster, in the orders of a Williams design
    (trials.trial_orders)."""
    stats: list[dict[str, dict[str, JobStats]]] = []
    with _cluster(c, bandwidth) as cluster:
        cluster_info = cluster.describe()
        for trial, order in enumerate(trials.trial_orders(_scenario_names(c), c.trials)):
            stats.append({name: scenarios.run_scenario(cluster, c, name, out, f"t{trial}_{name}",
                                                       jobs=scenarios.job_names(c.jobs))
                          for name in order})
    return stats, cluster_info


def _scenario_names(c: Any) -> list[str]:
    """The scenarios asked for, in SCENARIOS' order (the first trial's)."""
    return [name for name in SCENARIOS if name in c.scenarios]


def compare_at(c: Any, out: pathlib.Path, bandwidth: float | None,
               regime: Mapping[str, Any]) -> dict[str, Any]:
    """Runs the trials at one bandwidth; writes compare.{json,md,png} in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    stats, cluster_info = _run_trials(c, out, bandwidth)
    per_trial = []
    for trial, trial_stats in enumerate(stats):
        per_trial.append(summarise(trial_stats, c.warmup_steps,
                                   {"trial": trial, "order": list(trial_stats)}))
    result = trials.combine(per_trial)
    result["settings"] = {**vars(c), "bandwidth_mbit": bandwidth, "cluster": cluster_info}
    result["order_design"] = trials.order_design(_scenario_names(c), c.trials)
    result["regime"] = {**regime, "bandwidth_mbit": bandwidth,
                        "achieved_comm_to_compute": trials.spread(
                            [trials.comm_to_compute(t) for t in per_trial])}
    plan_trials(result)
    (out / "compare.json").write_text(json.dumps(result, indent=2, default=str))
    table = report.markdown(result)
    (out / "compare.md").write_text(table)
    _attribute(result, out, c.jobs)
    shown = stats[result["representative_trial"]]
    leased = next((shown[n] for n in ("crossover", "priority") if n in result["scenarios"]),
                  None)
    if leased:
        report.plot(result, leased, str(out / "compare.png"))
    print(table)
    for check in result["checks"]:
        logging.warning("check failed: %s", check)
    _raise_if_nothing_measured(result, c.scenarios)
    print(f"results: {out / 'compare.json'}, {out / 'compare.md'}, {out / 'compare.png'}; "
          f"tensorboard --logdir {out / 'tensorboard'}")
    return result


def _raise_if_nothing_measured(result: Mapping[str, Any], asked: Sequence[str]) -> None:
    """A comparison whose concurrent scenarios were all invalid in every trial measured
    nothing: it fails, loudly, after writing what it saw (compare.md says why)."""
    concurrent = [n for n in asked if n in scenarios.CONCURRENT]
    measured = [n for n in concurrent for t in result["per_trial"] if n in t["scenarios"]]
    if concurrent and not measured:
        reasons = "; ".join(f"{n}: {r[0]['reason']}" for n, r in result["invalid"].items())
        raise RuntimeError(f"no concurrent scenario ran long enough to measure ({reasons})")


def run(flag_values: flags.FlagValues = flags.FLAGS,
        overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The comparison (or the sweep, with --sweep_comm_to_compute); returns what it wrote."""
    define_flags(flag_values)
    c = config_lib.resolve(flag_values, FLAG_NAMES, overrides, validate, "compare")
    if c.horovod_timelines:
        logging.warning("--horovod_timelines: Horovod's timeline writer spins on rank 0's core; "
                        "this run profiles, its throughput is not comparable to others")
    out = pathlib.Path(c.out_dir)  # compare_at and calibrate make the directories they use
    if sweep_ratios(c):
        return run_sweep(c, out, sweep_ratios(c))
    if c.bandwidth_mbit is not None:
        regime = {"comm_to_compute_asked": None, "bandwidth_source": "fixed", "calibration": None,
                  **measure_comm_costs(c, out, c.bandwidth_mbit, None)}
        return compare_at(c, out, c.bandwidth_mbit, regime)
    bandwidths, record = calibrate(c, out, [c.comm_to_compute])
    bandwidth = bandwidths[c.comm_to_compute]
    regime = {"comm_to_compute_asked": c.comm_to_compute, "bandwidth_source": "calibrated",
              "calibration": record, **measure_comm_costs(c, out, bandwidth, record)}
    return compare_at(c, out, bandwidth, regime)


def run_sweep(c: Any, out: pathlib.Path, ratios: Sequence[float]) -> dict[str, Any]:
    """One calibration (every ratio checked reachable before any comparison), then the
    comparison at each ratio in <out>/ratio_<r>; writes sweep.{json,md,png}."""
    bandwidths, record = calibrate(c, out, ratios)
    # One probe at the middle bandwidth: the CPU cost is per second and per MB, the link
    # contention a ratio of times.
    middle = sorted(bandwidths.values())[len(bandwidths) // 2]
    costs = measure_comm_costs(c, out, middle, record)
    rows = []
    for ratio in ratios:
        regime = {"comm_to_compute_asked": ratio, "bandwidth_source": "calibrated",
                  "calibration": record, **costs}
        result = compare_at(c, out / f"ratio_{ratio:g}", bandwidths[ratio], regime)
        rows.append(sweep.row(result))
    summary = {"calibration": record, "rows": rows}
    (out / "sweep.json").write_text(json.dumps(summary, indent=2))
    table = sweep.markdown(rows)
    (out / "sweep.md").write_text(table)
    sweep.plot(rows, str(out / "sweep.png"))
    print(table)
    print(f"sweep: {out / 'sweep.json'}, {out / 'sweep.md'}, {out / 'sweep.png'}")
    return summary


def plan_trials(result: dict[str, Any]) -> None:
    """(Re)computes the planner's predictions for every trial of a comparison result, from
    its solo profiles and regime (link calibration, comm CPU cost) only; result["planner"] is
    the representative trial's. Run again on a saved compare.json by experiments/replan.py."""
    for trial in result["per_trial"]:
        _attach_planner_validation(trial, result.get("regime"))
    chosen = result["per_trial"][result["representative_trial"]]
    if "planner" in chosen:
        result["planner"] = chosen["planner"]


def _attach_planner_validation(result: dict[str, Any],
                               regime: Mapping[str, Any] | None = None) -> None:
    """The planner's predictions for these jobs, from the solo profiles only, with % errors."""
    if not {"naive", "crossover"} <= set(result["scenarios"]):
        return
    from crossover_tf_planner import validate as planner_validate
    try:
        result["planner"] = planner_validate.validate_comparison(
            {**result, "regime": regime or result.get("regime")})
    except ValueError as err:  # e.g. a scenario the planner cannot model
        logging.warning("planner validation skipped: %s", err)


def measure_comm_costs(c: Any, out: pathlib.Path, bandwidth: float | None,
                       calibration: Mapping[str, Any] | None) -> dict[str, Any]:
    """The regime's ``comm_cpu`` (what an allreduce costs the shared core) and
    ``link_contention`` (what the link loses to allreduces overlapping at random, and an
    allreduce to a busy core), both from comm_cpu.py at the comparison's bandwidth and, when
    the link was calibrated, the job's own allreduce size; None each when switched off or the
    link is not shaped (nothing comparable to measure: the planner assumes no cost)."""
    if not c.comm_cpu_probe or bandwidth is None or c.force_localhost:
        return {"comm_cpu": None, "link_contention": None}
    from experiments import comm_cpu
    fit = (calibration or {}).get("fit")
    megabytes = fit["per_mbit_s"] / 8 if fit else comm_cpu.DEFAULT_MB
    try:
        measured = comm_cpu.measure(bandwidth, megabytes=megabytes, num_hosts=c.num_hosts,
                                    log_dir=str(out / "logs" / "comm_cpu"))
        contention = comm_cpu.measure_contention(bandwidth, megabytes=megabytes,
                                                 seconds=c.contention_probe_seconds,
                                                 num_hosts=c.num_hosts,
                                                 log_dir=str(out / "logs" / "contention"))
    except comm_cpu.NotShaped as err:
        logging.warning("comm costs not measured (the planner assumes none): %s", err)
        return {"comm_cpu": None, "link_contention": None}
    logging.info("comm CPU: %.3f CPU s per s waiting, %.2f CPU ms per MB; link contention: "
                 "shared efficiency %.3f, compute slowdown %.3f", measured.cpu_per_wait_s,
                 1e3 * measured.cpu_s_per_mb, contention.shared_efficiency,
                 contention.compute_slowdown)
    return {"comm_cpu": measured.to_dict(), "link_contention": contention.to_dict()}


main = config_lib.script_main(run)


if __name__ == "__main__":
    define_flags()
    app.run(main)
