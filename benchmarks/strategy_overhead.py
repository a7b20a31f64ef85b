"""Per-step overhead of CrossoverStrategy with a lease but no peer, against plain Horovod
(the same strategy with no group), measured side by side in one process, interleaved.

  python -m benchmarks.strategy_overhead [--model small_cnn] [--repeats 3] [--steps 80]

Prints the median step time of each variant, their ratio (goal: < 1.02) and the run-to-run
spread (the noise floor the ratio must be read against). The crossover runs are lone jobs:
their group declares one job (`--group_jobs=1`), as a job meant to run alone must, or the
join check waits for a peer that never comes and fails.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import uuid
from typing import Sequence

import numpy as np

from benchmarks.common import median_range, parse_args

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

VARIANTS = ("plain", "crossover")
# A few seconds after TensorFlow's start: one interleaved pair of short runs of a small model.
SHORT = {"model": "mlp", "steps": 8, "warmup_steps": 3, "repeats": 1}


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--dataset", default="synthetic:mnist")
    parser.add_argument("--global_batch_size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--warmup_steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    return parse_args(parser, SHORT, argv)


def run_variant(args: argparse.Namespace, variant: str, repeat: int, model_dir: str) -> float:
    """One run's mean step time (s): plain Horovod, or a lone job on a lease of its own (its
    segment removed after, so repeats never share one)."""
    from crossover_tf.lease.segments import unlink_segment
    from experiments import train
    group = f"ovh{uuid.uuid4().hex[:8]}" if variant == "crossover" else ""
    stats = train.run(overrides={
        "model": args.model, "dataset": args.dataset, "group": group, "group_jobs": 1,
        "global_batch_size": args.global_batch_size, "steps": args.steps,
        "warmup_steps": args.warmup_steps, "model_dir": model_dir, "job": f"{variant}{repeat}"})
    if group:
        unlink_segment(group, stats.device_key)
    return stats.step_time_s


def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    """Each variant's step times, one per repeat, interleaved so that drift hits both alike."""
    from experiments import train
    train.define_flags()
    step_times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for variant in VARIANTS:
                step_times[variant].append(run_variant(args, variant, repeat, tmp))
    return step_times


def report(args: argparse.Namespace, step_times: dict[str, list[float]]) -> None:
    """The medians, their ratio, and each variant's runs with their spread."""
    plain, crossed = (float(np.median(step_times[v])) for v in VARIANTS)
    print(f"model {args.model}, global batch {args.global_batch_size}, {args.repeats} runs "
          f"x {args.steps - args.warmup_steps} timed steps each")
    print(f"median step: plain Horovod {plain * 1e3:.2f} ms, crossover (no peer) "
          f"{crossed * 1e3:.2f} ms, ratio {crossed / plain:.4f}")
    for variant, times in step_times.items():  # run-to-run spread = the noise floor
        ms = [t * 1e3 for t in times]
        print(f"  {variant} runs (ms): {', '.join(f'{t:.2f}' for t in ms)}; "
              f"median [min–max] {median_range(ms)}")
    pairs = [c / p for p, c in zip(step_times["plain"], step_times["crossover"])]
    print(f"  ratio per interleaved pair: {median_range(pairs, 4)}")


def main(argv: Sequence[str] | None = None) -> None:
    args = arguments(argv)
    report(args, measure(args))


if __name__ == "__main__":
    main()
