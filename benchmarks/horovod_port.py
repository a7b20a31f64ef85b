"""A Horovod user's training loop as written and as ported, alone and in pairs, on the
emulated two-host cluster's shaped link (issue 60, items 1 and 3).

Why: docs/coming_from_horovod.md tells a Horovod user how to port a custom loop, and says a
port alone is slower than the original (its allreduce no longer hides behind the backward
pass: 13.2 against 17.5-18.1 images/s, MobileNetV2 at 200 Mbit/s). What the user weighs is
that cost alone against the gain of two ported jobs crossed over two original jobs side by
side; this measures both in one run, in alternating order, so that drift on a shared machine
falls on every arm.

  sudo python -m benchmarks.horovod_port [--mbit 200] [--model MobileNetV2]
      [--image_size 224] [--batch_size 8] [--steps 30] [--repeats 3] [--port_keras 3]
      [--out runs/horovod_port/result.json]

The loop (benchmarks/horovod_port_worker.py, the project's, not Horovod's file) has the shape of
Horovod's tensorflow2_synthetic_benchmark.py: one fixed synthetic batch (--batch_size images a
rank), a keras.applications model with random weights, SGD, a `@tf.function` step with
hvd.DistributedGradientTape and the broadcast after the first batch, images/s over the timed
steps after warm-up (a job's: its rank 0's rate times its size, as Horovod's benchmark prints).
Legacy Keras (tf_keras) in both variants, since Horovod's tape and broadcast do not take Keras 3
variables (horovod#4290); --port_keras 3 runs the port on Keras 3 (the original stays legacy).
Arms, each job two ranks (one per emulated host, Horovod over Gloo, started by the cluster's
launcher with horovodrun's Gloo environment and Horovod's own rendezvous server: horovodrun
itself cannot start a rank inside a network namespace):

  original_alone   one original job (hvd.init, hvd.DistributedGradientTape,
                   hvd.broadcast_variables in the step);
  port_alone       one ported job (CrossoverStrategy, the step in strategy.hold_device(),
                   strategy.gradient_tape, the broadcast eagerly after the first step) in a
                   crossover group of its own, LeaseOptions(jobs=1): a ported user's script
                   alone still takes the lease every step, and that is the cost measured;
  ports_crossed    two ported jobs at once on the same hosts, one group of 2 jobs
                   ($CROSSOVER_GROUP, LeaseOptions(jobs=2));
  originals_naive  two original jobs at once on the same hosts, side by side.

The jobs of an arm wait for each other after warm-up (a file barrier), so a pair's timed
windows coincide; a pair's images/s is the sum of its jobs'. Prints each round's figures and,
over the rounds, each arm's images/s and the ratios port_alone / original_alone and
ports_crossed / originals_naive as median [min–max]; writes them with every job's figures to
--out (rewritten after each round, "complete": false until the last). Needs root (network
namespaces); namespaces and lease segments are removed on exit, failure or signal.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import sys
import time
import uuid
from typing import Any, Sequence

from benchmarks.common import median_range, parse_args
from experiments import launch_pair
from experiments.cluster import remove_lease_segments
from experiments.cluster.netns import EmulatedCluster
from experiments.comparison.trials import spread

REPO = pathlib.Path(__file__).resolve().parents[1]
WORKER = pathlib.Path(__file__).with_name("horovod_port_worker.py")
# Each arm: the loop's variant, how many jobs run it at once, and the port's
# CommunicationOptions.bucket_bytes (None: its default, the allreduce in buckets overlapping the
# backward pass; 0: one allreduce after it, the port before issue 60's overlap).
ARMS = {"original_alone": ("original", 1, None), "port_alone": ("port", 1, None),
        "ports_crossed": ("port", 2, None), "originals_naive": ("original", 2, None),
        "port_alone_one_allreduce": ("port", 1, 0)}
DEFAULT_ARMS = ("original_alone", "port_alone", "ports_crossed", "originals_naive")
JOB_NAMES = ("A", "B")
RATIOS = {"port_alone / original_alone": ("port_alone", "original_alone"),
          "ports_crossed / originals_naive": ("ports_crossed", "originals_naive"),
          "port_alone / port_alone_one_allreduce": ("port_alone", "port_alone_one_allreduce")}
# A few minutes, nearly all TensorFlow's start in six jobs: MobileNetV2 at 32x32, a third as
# wide, 10 classes, 3 timed steps, one round; bounded within the smoke test's own limit, so
# that the run ends itself (and removes its namespaces) before the test would kill it.
SHORT = {"image_size": 32, "alpha": 0.35, "classes": 10, "warmup_steps": 2, "steps": 3,
         "repeats": 1, "job_timeout_s": 300.0, "timeout_s": 900.0}
_RESULT = re.compile(r"^RESULT (\{.*\})$", re.M)


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mbit", type=float, default=200.0, help="the link's bandwidth")
    parser.add_argument("--model", default="MobileNetV2", help="a keras.applications model")
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--alpha", type=float, default=1.0,
                        help="width multiplier (MobileNet and MobileNetV2 only)")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--batch_size", type=int, default=8, help="images a rank, a step")
    parser.add_argument("--warmup_steps", type=int, default=5,
                        help="untimed steps a job (the first one broadcasts)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps a job")
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds of the four arms, in alternating order")
    parser.add_argument("--port_keras", choices=("legacy", "3"), default="legacy",
                        help="the port's Keras: tf_keras (as the original's) or Keras 3")
    parser.add_argument("--job_timeout_s", type=float, default=1200.0,
                        help="hard limit on one arm's jobs")
    parser.add_argument("--timeout_s", type=float, default=4 * 3600.0,
                        help="hard limit on the whole benchmark")
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                        help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--out", default="runs/horovod_port/result.json",
                        help="the JSON result; rank logs go to a logs/ folder beside it")
    args = parse_args(parser, SHORT, argv)
    args.arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown or not args.arms or len(set(args.arms)) != len(args.arms):
        parser.error(f"--arms: each of {', '.join(ARMS)} at most once; got {args.arms}")
    if args.repeats < 1 or args.steps < 1 or args.warmup_steps < 1 or args.batch_size < 1:
        parser.error("--repeats, --steps, --warmup_steps and --batch_size must be >= 1")
    if not (args.mbit > 0 and args.job_timeout_s > 0 and args.timeout_s > 0):
        parser.error("--mbit, --job_timeout_s and --timeout_s must be positive")
    return args


def arm_order(round_index: int, arms: Sequence[str]) -> list[str]:
    """The arms in round r's order: as listed in even rounds, reversed in odd ones."""
    order = list(arms)
    return order if round_index % 2 == 0 else order[::-1]


def worker_command(args: argparse.Namespace, variant: str, jobs: int, barrier: str,
                   bucket_bytes: int | None = None) -> list[str]:
    """One rank's command line: the worker with this run's model and sizes."""
    buckets = [] if bucket_bytes is None else ["--bucket_bytes", str(bucket_bytes)]
    return [sys.executable, str(WORKER), variant, *buckets, "--model", args.model,
            "--image_size", str(args.image_size), "--alpha", str(args.alpha),
            "--classes", str(args.classes), "--batch_size", str(args.batch_size),
            "--warmup_steps", str(args.warmup_steps), "--steps", str(args.steps),
            "--keras", args.port_keras if variant == "port" else "legacy",
            "--group_jobs", str(jobs), "--barrier", barrier,
            "--barrier_timeout_s", str(min(args.job_timeout_s, 600.0))]


def rank_results(result: dict[str, Any], what: str) -> list[dict[str, Any]]:
    """Each rank's RESULT line (rank order) of a finished job of run_jobs'."""
    found = []
    for log in result["logs"]:
        text = pathlib.Path(log).read_text(errors="replace")
        match = _RESULT.search(text)
        if match is None:
            raise RuntimeError(f"{what}: no RESULT line in {log}:\n{text[-3000:]}")
        found.append(json.loads(match.group(1)))
    return found


def check_port(ranks: list[dict[str, Any]], group: str, what: str) -> None:
    """A port job that did not run as meant fails the arm: crossing on Horovod, its group."""
    for r in ranks:
        if not (r.get("crossover") and r.get("group") == group
                and r.get("communicator") == "HorovodCommunicator"
                and r.get("horovod_rank_matches")):
            raise RuntimeError(f"{what}: rank {r.get('rank')} did not run as a crossover job "
                               f"of group {group} on Horovod: {r}")


def overlap(windows: list[list[float]]) -> float:
    """How much the jobs' timed windows coincide: their common time over their union."""
    starts, ends = [w[0] for w in windows], [w[1] for w in windows]
    union = max(ends) - min(starts)
    return max(0.0, min(ends) - max(starts)) / union if union > 0 else 1.0


def run_arm(cluster: EmulatedCluster, args: argparse.Namespace, arm: str, group: str,
            run_dir: pathlib.Path, timeout_s: float) -> dict[str, Any]:
    """One arm's job(s), at once; returns each job's figures and the arm's images/s."""
    variant, count, bucket_bytes = ARMS[arm]
    barrier_dir = run_dir / "barrier"
    shutil.rmtree(barrier_dir, ignore_errors=True)
    command = worker_command(args, variant, count, f"{barrier_dir}:{count * cluster.num_hosts}",
                             bucket_bytes)
    env = {"CROSSOVER_GROUP": group,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                       os.environ.get("PYTHONPATH")]))}
    try:
        results = launch_pair.run_jobs(cluster, {job: command for job in JOB_NAMES[:count]},
                                       mode="concurrent", log_dir=str(run_dir / "logs"),
                                       timeout_s=timeout_s, env=env, backend="horovod")
    finally:
        if group:
            remove_lease_segments([group])
    launch_pair.raise_on_failure(results, arm)
    jobs = {}
    for job, result in results.items():
        ranks = rank_results(result, f"{arm} job {job}")
        if variant == "port":
            check_port(ranks, group, f"{arm} job {job}")
        jobs[job] = {"images_per_s": ranks[0]["images_per_s"], "wall_s": result["wall_s"],
                     "ranks": ranks}
    figures = {"variant": variant, "group": group, "jobs": jobs,
               "images_per_s": sum(j["images_per_s"] for j in jobs.values())}
    if count > 1:
        figures["window_overlap"] = overlap([j["ranks"][0]["window"] for j in jobs.values()])
    return figures


def round_ratios(arms: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The ratios whose two arms ran."""
    return {name: arms[num]["images_per_s"] / arms[den]["images_per_s"]
            for name, (num, den) in RATIOS.items() if num in arms and den in arms}


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each arm's images/s and each ratio over the rounds: median, min, max, values."""
    per_arm = {arm: spread([r["arms"][arm]["images_per_s"] for r in rounds])
               for arm in rounds[0]["arms"]}
    ratios = {name: spread([r["ratios"][name] for r in rounds]) for name in rounds[0]["ratios"]}
    return {"images_per_s": {k: v.to_dict() for k, v in per_arm.items()},
            "ratios": {k: v.to_dict() for k, v in ratios.items()}}


def print_round(index: int, record: dict[str, Any]) -> None:
    arms = record["arms"]
    print(f"round {index} ({', '.join(record['order'])}): "
          + ", ".join(f"{arm} {arms[arm]['images_per_s']:.2f}" for arm in arms)
          + " images/s; " + ", ".join(f"{name} {value:.3f}"
                                      for name, value in record["ratios"].items()), flush=True)
    for arm in [a for a in ("ports_crossed", "originals_naive") if a in arms]:
        jobs = arms[arm]["jobs"]
        print(f"  {arm}: " + " + ".join(f"{job} {j['images_per_s']:.2f}"
                                        for job, j in jobs.items())
              + f" images/s, timed windows overlap {arms[arm]['window_overlap']:.2f}",
              flush=True)


def write(out: pathlib.Path, result: dict[str, Any]) -> None:
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(out)


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    deadline = time.monotonic() + args.timeout_s
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    run_root = out.parent / "logs" / time.strftime("%Y%m%d-%H%M%S")
    print(f"{args.model} {args.image_size}x{args.image_size}"
          f"{f' alpha {args.alpha:g}' if args.alpha != 1.0 else ''}, batch {args.batch_size} "
          f"a rank, {args.warmup_steps} warm-up + {args.steps} timed steps a job, 2 ranks a job "
          f"on 2 emulated hosts at {args.mbit:g} Mbit/s; original on tf_keras, port on "
          f"{'tf_keras' if args.port_keras == 'legacy' else 'Keras 3'}; {args.repeats} "
          f"round(s); logs in {run_root}", flush=True)
    # Every port arm's group named up front, so that the cluster's exit hooks remove their lease
    # segments too, whatever ends the run.
    groups = {(r, arm): (f"hp{uuid.uuid4().hex[:8]}" if ARMS[arm][0] == "port" else "")
              for r in range(args.repeats) for arm in args.arms}
    result: dict[str, Any] = {"benchmark": "horovod_port", "argv": sys.argv[1:],
                              "settings": vars(args), "complete": False, "rounds": []}
    with EmulatedCluster(num_hosts=2, bandwidth_mbit=args.mbit,
                         lease_groups=[g for g in groups.values() if g]) as cluster:
        result["cluster"] = cluster.describe()
        if not cluster.is_emulated:
            raise SystemExit(f"needs root and ip netns (no emulated link otherwise): "
                             f"{cluster.fallback_reason}")
        for r in range(args.repeats):
            record: dict[str, Any] = {"order": arm_order(r, args.arms), "arms": {}}
            for arm in record["order"]:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"--timeout_s {args.timeout_s:g} passed before round "
                                       f"{r}'s {arm}")
                record["arms"][arm] = run_arm(cluster, args, arm, groups[(r, arm)],
                                              run_root / f"r{r}_{arm}",
                                              min(args.job_timeout_s, left))
            record["arms"] = {arm: record["arms"][arm] for arm in args.arms}
            record["ratios"] = round_ratios(record["arms"])
            result["rounds"].append(record)
            result["summary"] = summary(result["rounds"])
            write(out, result)
            print_round(r, record)
    result["complete"] = True
    write(out, result)
    rounds = result["rounds"]
    print(f"images/s over {len(rounds)} round(s), median [min–max] (a pair: both jobs' sum):")
    for arm in args.arms:
        print(f"  {arm:<24} {median_range([r['arms'][arm]['images_per_s'] for r in rounds])}")
    for name in rounds[0]["ratios"]:
        print(f"{name} over {len(rounds)} round(s), median [min–max]: "
              f"{median_range([r['ratios'][name] for r in rounds], 3)}")
    print(f"result: {out}")


if __name__ == "__main__":
    main()
