"""Two jobs on one device of this machine: solo, naive co-location and crossover, side by side.

  python -m experiments.gpu_pair --steps=60 --model_dir=runs/gpu_check

What scripts/gpu_check.sh runs on a GPU machine: each job is `horovodrun --gloo -np 1` on
localhost training experiments.train (ResNet-20 on synthetic CIFAR-10 by default), so both jobs
land on GPU 0 and pair through its physical lease key. It reports throughput and peak device
memory per job, which is what tells whether two jobs fit and whether crossing pays there.
On a CPU machine the same runs use the CPU as the device (useful to test this script).
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import uuid
from typing import Any, Mapping

from absl import app, flags, logging

from crossover_tf_planner.job_stats import JobStats
from experiments import config as config_lib
from experiments import throughput

FLAG_NAMES = ["model", "dataset", "global_batch_size", "steps", "warmup_steps",
              "memory_limit_mb", "model_dir", "timeout_s"]
SCENARIOS = {"solo": ("A",), "naive": ("A", "B"), "crossover": ("A", "B")}


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Training flags are train.py's own, with this experiment's defaults."""
    from experiments import train
    train.define_flags(flag_values)
    for name, default in (("model", "resnet20"), ("dataset", "synthetic:cifar10"),
                          ("global_batch_size", 128), ("steps", 60), ("warmup_steps", 10),
                          ("model_dir", "runs/gpu_pair")):
        flag_values.set_default(name, default)
    define = config_lib.flag_definer(flag_values)
    define(flags.DEFINE_float, "timeout_s", 600.0, "Bound on each scenario's wall time.")


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


def _run_scenario(c: Any, name: str, out: pathlib.Path) -> dict[str, JobStats]:
    """Starts the scenario's jobs together (one horovodrun each) and waits, bounded."""
    jobs = SCENARIOS[name]
    group = f"gp{uuid.uuid4().hex[:8]}" if name == "crossover" else ""
    barrier = out / "barriers" / name
    shutil.rmtree(barrier, ignore_errors=True)
    horovodrun = str(pathlib.Path(sys.executable).with_name("horovodrun"))
    env = {k: v for k, v in os.environ.items() if k != "CROSSOVER_DEVICE_KEY"}
    procs = {}
    for job in jobs:
        argv = _train_argv(c, job, group, str(out / name),
                           f"{barrier}:{len(jobs)}" if len(jobs) > 1 else "")
        log = open(out / f"{name}_{job}.log", "w")  # noqa: SIM115 - closed after the wait
        procs[job] = (subprocess.Popen([horovodrun, "--gloo", "-np", "1", "-H", "localhost:1",
                                        *argv], env=env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True), log)
    failed = []
    for job, (proc, log) in procs.items():
        try:
            proc.wait(timeout=c.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()
        if proc.returncode != 0:
            failed.append(f"{job} (exit {proc.returncode}, log {log.name})")
    if group:
        from crossover_tf.lease.segments import remove_group_segments
        remove_group_segments([group])
    if failed:
        raise RuntimeError(f"scenario {name}: job(s) failed: {', '.join(failed)}")
    return {job: JobStats.from_json(out / name / job / "stats.json") for job in jobs}


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
    for name in SCENARIOS:
        logging.info("gpu_pair: scenario %s", name)
        stats[name] = _run_scenario(c, name, out)
    summary = summarise(stats, c.warmup_steps)
    summary["settings"] = {name: getattr(c, name) for name in FLAG_NAMES}
    config_lib.write_results(out, "gpu_pair", summary, markdown(summary))
    return summary


main = config_lib.script_main(run)


if __name__ == "__main__":
    define_flags()
    app.run(main)
