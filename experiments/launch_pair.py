"""Runs two Horovod jobs (A and B) on one emulated cluster, concurrently or one after the other.

Example:
  python -m experiments.launch_pair --num_hosts=2 --bandwidth_mbit=100 --mode=concurrent \
      --job_a="python -m experiments.train --job=A" --job_b="python -m experiments.train --job=B"

Each job gets one rank per emulated host (its own Horovod world and rendezvous server); the
cluster, lease segments and every rank are cleaned up whatever happens. Prints a JSON result.
"""
from __future__ import annotations

import json
import pathlib
import shlex
import sys
import time
from typing import Any, Mapping

from absl import app, flags, logging

from experiments import config as config_lib
from experiments.cluster import linkprobe
from experiments.cluster.launch import launch_job, wait_jobs
from experiments.cluster.netns import EmulatedCluster

DEFAULT_LOG_DIR = "runs/launch_pair"
MODES = ("concurrent", "sequential", "single")
_PYTHON_NAMES = ("python", "python3")

def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines this script's flags on flag_values (compare.py shares the cluster ones);
    log_dir is absl.logging's own flag when absl defined it first, and is shared."""
    define = config_lib.flag_definer(flag_values)
    define(flags.DEFINE_string, "job_a", None,
           "Command of job A (a leading `python` means this Python).")
    define(flags.DEFINE_string, "job_b", "", "Command of job B (unused in --mode=single).")
    define(flags.DEFINE_enum, "mode", "concurrent", "Run A and B together, A then B, or A only.",
           enum_values=MODES)
    define(flags.DEFINE_integer, "num_hosts", 2, "Emulated hosts; each job has one rank per host.")
    define(flags.DEFINE_float, "bandwidth_mbit", None,
           "Per-host link rate in Mbit/s (None: unlimited).")
    define(flags.DEFINE_float, "latency_ms", 0.0,
           "Added one-way delay per link end (needs sch_netem).")
    define(flags.DEFINE_list, "cpus", None,
           "CPU list per host for taskset (default: host i -> cpu i%n).")
    define(flags.DEFINE_string, "log_dir", "", "Per-rank logs go to <log_dir>/<job>/.")
    define(flags.DEFINE_float, "timeout_s", 600.0, "Hard limit for all jobs together, in seconds.")
    define(flags.DEFINE_list, "lease_groups", [],
           "Lease groups whose /dev/shm segments are removed after.")
    define(flags.DEFINE_bool, "force_localhost", False,
           "Skip namespaces: localhost ranks, no shaping.")
    define(flags.DEFINE_bool, "measure_bandwidth", False,
           "Measure host0->host1 TCP rate before the jobs.")
    define(flags.DEFINE_enum, "backend", "horovod",
           "How the ranks find each other: Horovod's rendezvous, or TF_CONFIG for "
           "CommunicationOptions(backend='tensorflow') (jobs with the default backend, auto, "
           "follow it).",
           enum_values=["horovod", "tensorflow"])
    define(flags.DEFINE_string, "result_json", None, "Also write the result dict to this file.")


FLAG_NAMES = config_lib.defined_names(define_flags)


def _check(c: Any) -> None:
    config_lib.require(c.mode in MODES, f"mode must be one of {MODES}, got {c.mode!r}")
    config_lib.require(bool(c.job_a) and (c.mode == "single" or bool(c.job_b)),
                       f"--job_a{'' if c.mode == 'single' else ' and --job_b'} required")


def _config(flag_values: flags.FlagValues, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """Flag values (defaults if unparsed) with `overrides` on top; never mutates the flags."""
    define_flags(flag_values)
    config = vars(config_lib.resolve(flag_values, FLAG_NAMES, overrides, _check,
                                     "launch_pair"))
    config["log_dir"] = config["log_dir"] or DEFAULT_LOG_DIR
    return config


def parse_command(command: str) -> list[str]:
    """Splits a shell-style command; a leading `python`/`python3` becomes this interpreter."""
    argv = shlex.split(command)
    if argv and argv[0] in _PYTHON_NAMES:
        argv[0] = sys.executable
    return argv


def _run_jobs(cluster: EmulatedCluster, config: Mapping[str, Any]) -> dict[str, dict]:
    jobs = {"A": parse_command(config["job_a"])}
    if config["mode"] != "single":
        jobs["B"] = parse_command(config["job_b"])
    return run_jobs(cluster, jobs, mode=config["mode"], log_dir=config["log_dir"],
                    timeout_s=config["timeout_s"], backend=config["backend"])


def run_jobs(cluster: EmulatedCluster, jobs: Mapping[str, list[str]], *, mode: str,
             log_dir: str, timeout_s: float, env: Mapping[str, str] | None = None,
             host_device_key: bool = True, backend: str = "horovod") -> dict[str, dict]:
    """Runs the named jobs on an existing cluster together (concurrent) or in order, within
    one overall time budget, every rank with `env` added; returns wait_jobs' per-job
    results. host_device_key (launch.rank_env's): False on a real device, whose lease key the
    runtime finds."""
    deadline = time.monotonic() + timeout_s

    def start(name: str):
        return launch_job(cluster, jobs[name], job_name=name,
                          env={**(env or {}), "CROSSOVER_JOB": name}, log_dir=log_dir,
                          timeout_s=deadline - time.monotonic(),
                          host_device_key=host_device_key, backend=backend)

    if mode == "concurrent":
        return wait_jobs([start(name) for name in jobs])
    results = {}
    for name in jobs:  # sequential (or single): each job gets what is left of the time budget
        results.update(wait_jobs([start(name)]))
    return results


def raise_on_failure(results: Mapping[str, dict], what: str) -> None:
    """A clear error for the first job of `results` (run_jobs') that failed: its failed rank,
    exit code, whether it timed out, and its log tail."""
    for job, result in results.items():
        if not result["ok"]:
            raise RuntimeError(
                f"{what}: job {job} failed (rank {result['failed_rank']}, exit "
                f"{result['failed_exit_code']}, timed out {result['timed_out']}); log tail:\n"
                f"{result['failed_log_tail']}")


def run(flag_values: flags.FlagValues = flags.FLAGS,
        overrides: Mapping[str, Any] | None = None) -> dict:
    """Builds the cluster, runs the job(s), always cleans up; returns per-job results."""
    config = _config(flag_values, overrides)
    started = time.monotonic()
    result: dict[str, Any] = {"mode": config["mode"]}
    with EmulatedCluster(num_hosts=config["num_hosts"], bandwidth_mbit=config["bandwidth_mbit"],
                         latency_ms=config["latency_ms"], cpus=config["cpus"],
                         force_localhost=config["force_localhost"],
                         lease_groups=config["lease_groups"]) as cluster:
        result["cluster"] = cluster.describe()
        if config["measure_bandwidth"] and len(cluster.hosts) > 1:
            result["measured_bandwidth_mbit"] = round(
                linkprobe.measure_mbit(cluster, cluster.hosts[0], cluster.hosts[1]), 2)
        result["jobs"] = _run_jobs(cluster, config)
    result["ok"] = all(job["ok"] for job in result["jobs"].values())
    result["wall_s"] = round(time.monotonic() - started, 3)
    for name, job in result["jobs"].items():
        if not job["ok"]:
            logging.error("job %s failed: rank %s exit %s timed_out=%s\n%s", name,
                          job["failed_rank"], job["failed_exit_code"], job["timed_out"],
                          job["failed_log_tail"])
    if config["result_json"]:
        pathlib.Path(config["result_json"]).write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str]) -> int:
    del argv
    try:
        result = run(flags.FLAGS)
    except KeyboardInterrupt:  # exit hooks already removed the cluster and killed the ranks
        logging.error("interrupted: cluster removed, ranks killed")
        return 130
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    define_flags()
    app.run(main)
