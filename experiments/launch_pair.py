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

from crossover_tf.cluster import linkprobe
from experiments import config as config_lib
from crossover_tf.cluster.launch import launch_job, wait_jobs
from crossover_tf.cluster.netns import EmulatedCluster

DEFAULT_LOG_DIR = "runs/launch_pair"
MODES = ("concurrent", "sequential", "single")
_PYTHON_NAMES = ("python", "python3")

_FLAG_NAMES = ("job_a", "job_b", "mode", "num_hosts", "bandwidth_mbit", "latency_ms", "cpus",
               "log_dir", "timeout_s", "lease_groups", "force_localhost", "measure_bandwidth",
               "result_json")


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines this script's flags on `flag_values` (idempotent per FlagValues)."""
    if "job_a" in flag_values:
        return
    fv = {"flag_values": flag_values}
    flags.DEFINE_string("job_a", None, "Command of job A (a leading `python` means this Python).", **fv)
    flags.DEFINE_string("job_b", "", "Command of job B (unused in --mode=single).", **fv)
    flags.DEFINE_enum("mode", "concurrent", MODES, "Run A and B together, A then B, or A only.", **fv)
    flags.DEFINE_integer("num_hosts", 2, "Emulated hosts; each job has one rank per host.", **fv)
    flags.DEFINE_float("bandwidth_mbit", None, "Per-host link rate in Mbit/s (None: unlimited).", **fv)
    flags.DEFINE_float("latency_ms", 0.0, "Added one-way delay per link end (needs sch_netem).", **fv)
    flags.DEFINE_list("cpus", None, "CPU list per host for taskset (default: host i -> cpu i%n).", **fv)
    if "log_dir" not in flag_values:  # absl.logging usually defines it already; we share it
        flags.DEFINE_string("log_dir", "", "Per-rank logs go to <log_dir>/<job>/.", **fv)
    flags.DEFINE_float("timeout_s", 600.0, "Hard limit for all jobs together, in seconds.", **fv)
    flags.DEFINE_list("lease_groups", [], "Lease groups whose /dev/shm segments are removed after.", **fv)
    flags.DEFINE_bool("force_localhost", False, "Skip namespaces: localhost ranks, no shaping.", **fv)
    flags.DEFINE_bool("measure_bandwidth", False, "Measure host0->host1 TCP rate before the jobs.", **fv)
    flags.DEFINE_string("result_json", None, "Also write the result dict to this file.", **fv)


def _check(c: Any) -> None:
    config_lib.require(c.mode in MODES, f"mode must be one of {MODES}, got {c.mode!r}")
    config_lib.require(bool(c.job_a) and (c.mode == "single" or bool(c.job_b)),
                       f"--job_a{'' if c.mode == 'single' else ' and --job_b'} required")


def _config(flag_values: flags.FlagValues, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """Flag values (defaults if unparsed) with `overrides` on top; never mutates the flags."""
    define_flags(flag_values)
    config = vars(config_lib.resolve(flag_values, list(_FLAG_NAMES), overrides, _check,
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
                    timeout_s=config["timeout_s"])


def run_jobs(cluster: EmulatedCluster, jobs: Mapping[str, list[str]], *, mode: str,
             log_dir: str, timeout_s: float) -> dict[str, dict]:
    """Runs the named jobs on an existing cluster together (concurrent) or in order, within
    one overall time budget; returns wait_jobs' per-job results."""
    deadline = time.monotonic() + timeout_s

    def start(name: str):
        return launch_job(cluster, jobs[name], job_name=name, env={"CROSSOVER_JOB": name},
                          log_dir=log_dir, timeout_s=deadline - time.monotonic())

    if mode == "concurrent":
        return wait_jobs([start(name) for name in jobs])
    results = {}
    for name in jobs:  # sequential (or single): each job gets what is left of the time budget
        results.update(wait_jobs([start(name)]))
    return results


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
