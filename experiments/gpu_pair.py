"""Two jobs on one device of this machine: solo, naive co-location and crossover, side by side.

  python -m experiments.gpu_pair --steps=60 --model_dir=runs/gpu_check

What scripts/gpu_check.sh runs on a GPU machine: each job is one Horovod rank on this machine,
started by the shared launcher (experiments.launch_pair), training experiments.train (ResNet-20
on synthetic CIFAR-10 by default), so both jobs land on GPU 0 and pair through its physical
lease key. It reports throughput and peak device memory per job, which is what tells whether
two jobs fit and whether crossing pays there.
On a CPU machine the same runs use the CPU as the device (useful to test this script).
"""
from __future__ import annotations

import os
import pathlib
import shutil
import uuid
from typing import Any, Mapping

from absl import app, flags, logging

from crossover_tf_planner.job_stats import JobStats
from experiments import config as config_lib
from experiments import launch_pair
from experiments.analysis import throughput
from experiments.cluster import EmulatedCluster, remove_lease_segments

SCENARIOS = {"solo": ("A",), "naive": ("A", "B"), "crossover": ("A", "B")}
# train.py's flags the jobs get from this script, with its defaults (None: train.py's).
TRAINING = {"model": "resnet20", "dataset": "synthetic:cifar10", "global_batch_size": 128,
            "steps": 60, "warmup_steps": 10, "model_dir": "runs/gpu_pair",
            "memory_limit_mb": None}


def _define_own(flag_values: flags.FlagValues) -> None:
    define = config_lib.flag_definer(flag_values)
    define(flags.DEFINE_float, "timeout_s", 600.0, "Bound on each scenario's wall time.")


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Training flags are train.py's own, with this experiment's defaults."""
    from experiments import train
    config_lib.adopt(flag_values, train.define_flags, TRAINING)
    _define_own(flag_values)


FLAG_NAMES = [*TRAINING, *config_lib.defined_names(_define_own)]


def validate(c: Any) -> None:
    _train_argv(c, "A", "", "", "")  # train.py validates what the jobs get
    config_lib.require(c.steps - c.warmup_steps >= 10, "need at least 10 timed steps")
    config_lib.require(c.timeout_s > 0, "timeout_s must be positive")


def _train_argv(c: Any, job: str, group: str, model_dir: str, barrier: str) -> list[str]:
    from experiments import train
    return train.train_argv({
        "job": job, "group": group, "model": c.model, "dataset": c.dataset,
        "global_batch_size": c.global_batch_size, "steps": c.steps,
        "warmup_steps": c.warmup_steps, "model_dir": model_dir, "start_barrier": barrier,
        "memory_limit_mb": c.memory_limit_mb})


def scenario_commands(c: Any, name: str, out: pathlib.Path) -> tuple[dict[str, list[str]], str]:
    """Each job's train.py command for scenario `name`, and its lease group ("" for none):
    only crossover pairs the jobs through a lease; jobs run together start at one barrier."""
    jobs = SCENARIOS[name]
    group = f"gp{uuid.uuid4().hex[:8]}" if name == "crossover" else ""
    barrier = f"{out / 'barriers' / name}:{len(jobs)}" if len(jobs) > 1 else ""
    return {job: _train_argv(c, job, group, str(out / name), barrier) for job in jobs}, group


def this_machine() -> EmulatedCluster:
    """This machine as the launcher's one (localhost) host, its ranks free to use every CPU
    this process may (an emulated host pins its ranks to one). Horovod keeps its own cycle
    time: on a GPU its polling is host CPU, not device time (netns.DEFAULT_CYCLE_TIME_MS)."""
    cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    return EmulatedCluster(num_hosts=1, cpus=[cpus], force_localhost=True,
                           horovod_cycle_time_ms=None)


def _run_scenario(cluster: EmulatedCluster, c: Any, name: str, out: pathlib.Path
                  ) -> dict[str, JobStats]:
    """Starts the scenario's jobs together (one rank each) and waits, bounded. The launcher
    sets no device key: the jobs pair through the runtime's physical key of the device."""
    commands, group = scenario_commands(c, name, out)
    shutil.rmtree(out / "barriers" / name, ignore_errors=True)  # arrivals of an earlier run
    try:
        results = launch_pair.run_jobs(cluster, commands, mode="concurrent",
                                       log_dir=str(out / "logs" / name),
                                       timeout_s=c.timeout_s, host_device_key=False)
    finally:
        if group:
            remove_lease_segments([group])
    launch_pair.raise_on_failure(results, f"scenario {name}")
    return {job: JobStats.from_json(out / name / job / "stats.json") for job in commands}


def summarise(stats: Mapping[str, Mapping[str, JobStats]], warmup_steps: int) -> dict[str, Any]:
    """Per job: images/s, median step and peak memory; per scenario: the aggregate."""
    rows, aggregate = [], {}
    for name, jobs in stats.items():
        if len(jobs) > 1:
            aggregate[name], per_job, _ = throughput.concurrent_aggregate(jobs, warmup_steps)
        else:
            per_job = {job: s.images_per_s for job, s in jobs.items()}
            aggregate[name] = sum(per_job.values())
        for job, s in jobs.items():
            rows.append({"scenario": name, "job": job, "images_per_s": per_job[job],
                         "step_ms": 1e3 * s.step_time_s,
                         "peak_device_memory_mb": s.peak_device_memory_mb})
    ratios = {"crossover_over_naive": aggregate["crossover"] / aggregate["naive"],
              "crossover_over_solo": aggregate["crossover"] / aggregate["solo"],
              "naive_over_solo": aggregate["naive"] / aggregate["solo"]}
    return {"rows": rows, "aggregate_images_per_s": aggregate, "ratios": ratios}


def markdown(summary: Mapping[str, Any]) -> str:
    lines = ["| scenario | job | images/s | median step (ms) | peak device memory (MiB) |",
             "|---|---|---:|---:|---:|"]
    for r in summary["rows"]:
        memory = r["peak_device_memory_mb"]
        lines.append(f"| {r['scenario']} | {r['job']} | {r['images_per_s']:.1f} | "
                     f"{r['step_ms']:.1f} | {'-' if memory is None else f'{memory:.0f}'} |")
    lines.append("")
    lines += [f"- aggregate {name}: {value:.1f} images/s"
              for name, value in summary["aggregate_images_per_s"].items()]
    lines += [f"- {name.replace('_', ' ')}: {value:.3f}"
              for name, value in summary["ratios"].items()]
    return "\n".join(lines) + "\n"


def run(flag_values: flags.FlagValues = flags.FLAGS,
        overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    define_flags(flag_values)
    c = config_lib.resolve(flag_values, FLAG_NAMES, overrides, validate, "gpu_pair")
    out = pathlib.Path(c.model_dir)
    out.mkdir(parents=True, exist_ok=True)
    stats = {}
    with this_machine() as cluster:
        for name in SCENARIOS:
            logging.info("gpu_pair: scenario %s", name)
            stats[name] = _run_scenario(cluster, c, name, out)
    summary = summarise(stats, c.warmup_steps)
    summary["settings"] = {name: getattr(c, name) for name in FLAG_NAMES}
    config_lib.write_results(out, "gpu_pair", summary, markdown(summary))
    return summary


main = config_lib.script_main(run)


if __name__ == "__main__":
    define_flags()
    app.run(main)
