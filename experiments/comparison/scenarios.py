"""Runs one scenario of the comparison (all its jobs, or one alone) on an emulated cluster.

Kept apart from comparison/run.py, which decides what to run (calibration, trials, sweep); this
module knows how: each rank's train.py command, lease groups, start barriers, logs, failures.

Scenarios: sequential (each job alone, one after another), naive (all together, no lease),
crossover (all together on one lease group, FIFO turns), naive_env and crossover_env (naive
and crossover with extra environment variables for every rank, e.g. HOROVOD_CYCLE_TIME=5: a
runtime setting measured in the same interleaved trials as the plain scenarios), shift (naive
with the second job's timed steps started at a static shift, comparison/shift.py),
crossover_turn (crossover whose jobs also take link turns: one allreduce at a time) and priority
(two jobs on one lease group: the first is the primary, the second a secondary split into
micro-batches).
"""
from __future__ import annotations

import pathlib
import re
import shlex
import shutil
import uuid
from typing import Any, Mapping, Sequence

from absl import logging

from crossover_tf_planner.job_stats import JobStats
from crossover_tf_planner.registry import CONCURRENT, NO_LEASE, SCENARIOS, SHIFT, WITH_ENV
from experiments.comparison import period_fit

JOB_NAMES = "ABCD"  # compare.py runs 2..4 jobs, named in this order
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


def parse_env(assignments: Sequence[str]) -> dict[str, str]:
    """KEY=VALUE strings (compare.py's --scenario_env) as a dict; a clear error for anything
    that is not an environment assignment, or for a key given twice."""
    env: dict[str, str] = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep or not ENV_NAME.fullmatch(key) or key in env:
            raise ValueError(f"scenario_env takes distinct KEY=VALUE environment assignments "
                             f"(KEY in capitals), got {item!r}")
        env[key] = value
    return env


def job_names(count: int) -> tuple[str, ...]:
    """The names of `count` jobs: A, B, ... (a clear error outside 1..len(JOB_NAMES))."""
    if not 1 <= count <= len(JOB_NAMES):
        raise ValueError(f"a comparison runs 1..{len(JOB_NAMES)} jobs, got {count}")
    return tuple(JOB_NAMES[:count])


def job_settings(name: str, jobs: Sequence[str], secondary_micro_batches: int
                 ) -> dict[str, dict[str, Any]]:
    """Per-job train.py settings a scenario adds: how many jobs share the group (1 in
    `sequential`, where each job runs alone on its lease); in `priority` the first job is the
    primary and every other one a secondary computing in `secondary_micro_batches`
    micro-batches; in `crossover_turn` job i takes link turn i."""
    group_jobs = {"group_jobs": 1 if name == "sequential" else len(jobs)}
    if name == "crossover_turn":
        return {job: {"link_turn": i, **group_jobs} for i, job in enumerate(jobs)}
    if name != "priority":
        return {job: dict(group_jobs) for job in jobs}
    return {job: ({"priority": "primary", **group_jobs} if i == 0 else
                  {"priority": "secondary", "micro_batches": secondary_micro_batches,
                   **group_jobs})
            for i, job in enumerate(jobs)}


def job_shape(c: Any, job: str, steps: int | None = None) -> dict[str, Any]:
    """A job's model, global batch and steps: the comparison's, except job B's where it is
    shaped to another period (--job_b_model, --job_b_global_batch_size: comparison/
    period_calibrate.py); a shaped B runs its timed steps over the period ratio, so that
    both jobs' timed runs last about as long (`steps`, a calibration run's, stays)."""
    shape = {"model": c.model, "global_batch_size": c.global_batch_size,
             "steps": steps or c.steps}
    model, batch = getattr(c, "job_b_model", ""), getattr(c, "job_b_global_batch_size", 0)
    if job != "B" or not (model or batch):  # (settings made by hand may name neither)
        return shape
    return {"model": model or c.model, "global_batch_size": batch or c.global_batch_size,
            "steps": steps or period_fit.steps_for(c.steps, c.warmup_steps,
                                                   getattr(c, "period_ratio", 0.0) or 1.0)}


def train_command(c: Any, job: str, group: str, model_dir: str, barrier: str,
                  steps: int | None = None, extra: Mapping[str, Any] | None = None
                  ) -> list[str]:
    """One rank's command: train.py with the comparison's training settings (job_shape's
    model, batch and steps for this job) and `extra`."""
    from experiments import train
    return train.train_argv({
        "job": job, "group": group, "dataset": c.dataset, **job_shape(c, job, steps),
        "warmup_steps": c.warmup_steps, "learning_rate": c.learning_rate,
        "jit_compile": c.jit_compile, "model_dir": model_dir, "start_barrier": barrier,
        "backend": c.backend, **(extra or {})})


def run_scenario(cluster: Any, c: Any, name: str, out: pathlib.Path, run_name: str = "",
                 jobs: Sequence[str] = ("A", "B"), steps: int | None = None,
                 start_shifts: Mapping[str, float] | None = None) -> dict[str, JobStats]:
    """Runs the jobs of scenario `name` (sequential: one after the other, each holding an
    uncontended lease so its timeline gives C and M; naive: together without a lease;
    crossover: together sharing one; naive_env and crossover_env: naive and crossover with
    --scenario_env in every rank's environment; shift: naive, each job's timed steps started
    `start_shifts` seconds after the barrier; crossover_turn: crossover with link turns;
    priority: together sharing one, as primary and secondaries).
    TensorBoard runs, logs and barriers go under `run_name` (default: the scenario's name).
    Returns each job's rank-0 stats.json contents."""
    from experiments import launch_pair
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; choose from sequential, "
                         f"{', '.join(CONCURRENT)}")
    if (name == SHIFT) != (start_shifts is not None):
        raise ValueError("start shifts go with the shift scenario, and it needs them")
    run_name = run_name or name
    group = "" if name in NO_LEASE else f"xo{uuid.uuid4().hex[:8]}"
    env = parse_env(c.scenario_env) if name in WITH_ENV else {}
    tensorboard_dir = out / "tensorboard" / run_name
    concurrent = name in CONCURRENT
    extra = job_settings(name, jobs, c.secondary_micro_batches)
    for job, shift_s in (start_shifts or {}).items():
        extra[job]["start_shift_s"] = shift_s
    if c.horovod_timelines:  # rank 0's, next to the job's stats.json
        for job in jobs:
            extra[job]["horovod_timeline"] = str(tensorboard_dir / job / "horovod_timeline.json")
    barriers = out / "barriers" / run_name
    shutil.rmtree(barriers, ignore_errors=True)  # arrivals of an earlier run
    # Concurrent jobs start training together (all ranks of both); sequential ones alone.
    commands = {job: train_command(c, job, group, str(tensorboard_dir), steps=steps, barrier=(
        f"{barriers}:{len(jobs) * c.num_hosts}" if concurrent else ""), extra=extra[job])
        for job in jobs}
    logging.info("scenario %s: %s%s", run_name, "".join(f"{k}={v} " for k, v in env.items()),
                 " ".join(map(shlex.quote, commands[jobs[0]])))
    results = launch_pair.run_jobs(cluster, commands,
                                   mode="concurrent" if concurrent else "sequential",
                                   log_dir=str(out / "logs" / run_name), timeout_s=c.timeout_s,
                                   env=env, backend=c.backend)
    if group:
        from experiments.cluster import remove_lease_segments
        remove_lease_segments([group])
    launch_pair.raise_on_failure(results, f"scenario {run_name}")
    return {job: JobStats.from_json(tensorboard_dir / job / "stats.json") for job in commands}
