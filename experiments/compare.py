"""Side-by-side comparison on one emulated cluster: solo, sequential, naive, crossover.

  python -m experiments.compare                      # README's main job
  python -m experiments.compare --bandwidth_mbit=100 --model=resnet20 --dataset=synthetic:cifar10

Two identical-shaped jobs A and B (one rank per emulated host each) are run with the same
model, data and settings as:
  sequential  A, then B (each alone: these runs are also the solo profiles, measured with a
              lease that nobody contends, which records each step's compute C and allreduce M)
  naive       A and B at the same time, no lease (device and link simply shared)
  crossover   A and B at the same time, sharing a device lease per host
The table, JSON, markdown and PNG land in --out_dir; TensorBoard runs of every scenario land
under <out_dir>/tensorboard, so `tensorboard --logdir <out_dir>/tensorboard` compares them.

Defaults (ResNet-20 on synthetic CIFAR-10, global batch 128, 2 hosts at 35 Mbit/s) were chosen
so that on a 2-core machine (one core per emulated host) compute C and allreduce M per step are
of the same order (about 0.27 s each): the regime where crossing pays. ResNet-20's 1.1 MB of
gradients also dwarf tc's token-bucket burst, so M reflects the configured rate; see README.
"""
from __future__ import annotations

import json
import pathlib
import shlex
import shutil
import uuid
from typing import Any, Mapping

from absl import app, flags, logging

from crossover_tf_planner.job_stats import JobStats
from crossover_tf_planner.policies import MEASURED
from experiments import config as config_lib
from experiments import report, throughput

FLAG_NAMES = ["model", "dataset", "global_batch_size", "steps", "warmup_steps", "learning_rate",
              "jit_compile", "bandwidth_mbit", "latency_ms", "num_hosts", "out_dir",
              "timeout_s", "force_localhost", "scenarios"]
SCENARIOS = MEASURED


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
                          ("bandwidth_mbit", 35.0), ("timeout_s", 900.0)):
        flag_values.set_default(name, default)
    define = config_lib.flag_definer(flag_values)
    define(flags.DEFINE_string, "out_dir", "runs/compare",
           "Where results and TensorBoard logs go.")
    define(flags.DEFINE_list, "scenarios", list(SCENARIOS),
           "Scenarios to run (sequential is needed: it provides the solo profiles).")


def validate(c: Any) -> None:
    _train_command(c, "A", "", "", "")  # train.py validates the settings the ranks get
    config_lib.require(c.bandwidth_mbit is None or c.bandwidth_mbit > 0,
                       "bandwidth_mbit must be positive")
    config_lib.require(c.num_hosts >= 2, "num_hosts must be >= 2: one host has no network")
    config_lib.require(c.global_batch_size % c.num_hosts == 0,
                       "global_batch_size must be divisible by num_hosts")
    config_lib.require(c.steps - c.warmup_steps >= 10, "need at least 10 timed steps")
    unknown = sorted(set(c.scenarios) - set(SCENARIOS))
    config_lib.require(not unknown, f"unknown scenarios {unknown}; choose from {SCENARIOS}")
    config_lib.require("sequential" in c.scenarios,
                       "the sequential scenario is required (it gives the solo profiles)")


def _train_command(c: Any, job: str, group: str, model_dir: str, barrier: str) -> list[str]:
    """One rank's command: train.py with the comparison's training settings."""
    from experiments import train
    return train.train_argv({
        "job": job, "group": group, "model": c.model, "dataset": c.dataset,
        "global_batch_size": c.global_batch_size, "steps": c.steps,
        "warmup_steps": c.warmup_steps, "learning_rate": c.learning_rate,
        "jit_compile": c.jit_compile, "model_dir": model_dir, "start_barrier": barrier})


def _run_scenario(cluster: Any, c: Any, name: str, out: pathlib.Path) -> dict[str, JobStats]:
    """Runs both jobs of one scenario; returns their rank-0 stats.json contents."""
    from experiments import launch_pair
    group = {"naive": ""}.get(name, f"xo{uuid.uuid4().hex[:8]}")
    tensorboard_dir = out / "tensorboard" / name
    concurrent = name != "sequential"
    shutil.rmtree(out / "barriers" / name, ignore_errors=True)  # arrivals of an earlier run
    # Concurrent jobs start training together (all ranks of both); sequential ones alone.
    jobs = {job: _train_command(c, job, group, str(tensorboard_dir), barrier=(
        f"{out / 'barriers' / name}:{2 * c.num_hosts}" if concurrent else ""))
        for job in ("A", "B")}
    logging.info("scenario %s: %s", name, " ".join(map(shlex.quote, jobs["A"])))
    results = launch_pair.run_jobs(cluster, jobs,
                                   mode="concurrent" if concurrent else "sequential",
                                   log_dir=str(out / "logs" / name), timeout_s=c.timeout_s)
    if group:
        from experiments.cluster import remove_lease_segments
        remove_lease_segments([group])
    for job, result in results.items():
        if not result["ok"]:
            raise RuntimeError(
                f"scenario {name}: job {job} failed (rank {result['failed_rank']}, exit "
                f"{result['failed_exit_code']}, timed out {result['timed_out']}); log tail:\n"
                f"{result['failed_log_tail']}")
    return {job: JobStats.from_json(tensorboard_dir / job / "stats.json") for job in jobs}


def summarise(stats: Mapping[str, Mapping[str, JobStats]], warmup_steps: int,
              settings: Mapping[str, Any]) -> dict[str, Any]:
    """Scenario table, ratios and the ideal ratio from the per-job stats of each scenario."""
    seq = stats["sequential"]
    scenarios: dict[str, Any] = {
        f"solo_{job}": {"jobs": {job: s.to_dict()}, "aggregate_images_per_s": s.images_per_s,
                        "per_job_in_aggregate": {job: s.images_per_s}}
        for job, s in seq.items()}
    sequential = throughput.sequential_aggregate(seq)
    total_images = sum(s.timed_images for s in seq.values())
    scenarios["sequential"] = {
        "jobs": {job: s.to_dict() for job, s in seq.items()},
        "aggregate_images_per_s": sequential,
        "per_job_in_aggregate": {job: sequential * s.timed_images / total_images
                                 for job, s in seq.items()}}
    for name in ("naive", "crossover"):
        if name in stats:
            aggregate, per_job, window = throughput.concurrent_aggregate(stats[name], warmup_steps)
            scenarios[name] = {"jobs": {j: s.to_dict() for j, s in stats[name].items()},
                               "aggregate_images_per_s": aggregate,
                               "per_job_in_aggregate": per_job, "window_s": window}
    agg = {n: s["aggregate_images_per_s"] for n, s in scenarios.items()}
    ideal = throughput.ideal_crossover_ratio(seq["A"], seq["B"])
    ratios = {"crossover_over_sequential": agg.get("crossover", float("nan")) / agg["sequential"],
              "crossover_over_naive": (agg.get("crossover", float("nan"))
                                       / agg.get("naive", float("nan"))),
              "naive_over_sequential": agg.get("naive", float("nan")) / agg["sequential"],
              "ideal_crossover_over_sequential": ideal}
    ratios["measured_over_ideal"] = ratios["crossover_over_sequential"] / ideal
    return {"settings": dict(settings), "scenarios": scenarios, "ratios": ratios}


def run(flag_values: flags.FlagValues = flags.FLAGS,
        overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Runs the scenarios on one cluster; writes compare.{json,md,png}; returns the result."""
    define_flags(flag_values)
    c = config_lib.resolve(flag_values, FLAG_NAMES, overrides, validate, "compare")
    from experiments.cluster import EmulatedCluster
    out = pathlib.Path(c.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stats: dict[str, dict] = {}
    with EmulatedCluster(num_hosts=c.num_hosts, bandwidth_mbit=c.bandwidth_mbit,
                         latency_ms=c.latency_ms, force_localhost=c.force_localhost) as cluster:
        cluster_info = cluster.describe()
        for name in SCENARIOS:
            if name in c.scenarios:
                stats[name] = _run_scenario(cluster, c, name, out)
    settings = {**vars(c), "cluster": cluster_info}
    result = summarise(stats, c.warmup_steps, settings)
    _attach_planner_validation(result)
    (out / "compare.json").write_text(json.dumps(result, indent=2, default=str))
    table = report.markdown(result)
    (out / "compare.md").write_text(table)
    if "crossover" in stats:
        import numpy as np
        phases = {job: np.asarray(s.phases_ns) for job, s in stats["crossover"].items()}
        report.plot(result, phases, str(out / "compare.png"))
    print(table)
    print(f"results: {out / 'compare.json'}, {out / 'compare.md'}, {out / 'compare.png'}; "
          f"tensorboard --logdir {out / 'tensorboard'}")
    return result


def _attach_planner_validation(result: dict[str, Any]) -> None:
    """The planner's predictions for this pair, from the solo profiles only, with % errors."""
    if not {"naive", "crossover"} <= set(result["scenarios"]):
        return
    from crossover_tf_planner import validate as planner_validate
    try:
        result["planner"] = planner_validate.validate_comparison(result)
    except ValueError as err:  # e.g. a scenario the planner cannot model
        logging.warning("planner validation skipped: %s", err)


main = config_lib.script_main(run)


if __name__ == "__main__":
    define_flags()
    app.run(main)
