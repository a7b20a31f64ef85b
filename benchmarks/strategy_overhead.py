"""Per-step overhead of CrossoverStrategy with a lease but no peer, against plain Horovod
(the same strategy with no group), measured side by side in one process, interleaved.

  python -m benchmarks.strategy_overhead [--model small_cnn] [--repeats 3] [--steps 80]

Prints the median step time of each variant and their ratio (goal: < 1.02).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import uuid

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--dataset", default="synthetic:mnist")
    parser.add_argument("--global_batch_size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from experiments import train
    train.define_flags()
    step_times: dict[str, list[float]] = {"plain": [], "crossover": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for variant in ("plain", "crossover"):   # interleaved: drift hits both alike
                group = f"ovh{uuid.uuid4().hex[:8]}" if variant == "crossover" else ""
                stats = train.run(overrides={
                    "model": args.model, "dataset": args.dataset, "group": group,
                    "global_batch_size": args.global_batch_size, "steps": args.steps,
                    "warmup_steps": 10, "model_dir": tmp, "job": f"{variant}{repeat}"})
                step_times[variant].append(stats.step_time_s)
                if group:
                    from crossover_tf.lease.segments import unlink_segment
                    unlink_segment(group, stats.device_key)
    plain, crossed = (float(np.median(step_times[v])) for v in ("plain", "crossover"))
    print(f"model {args.model}, global batch {args.global_batch_size}, {args.repeats} runs "
          f"x {args.steps - 10} timed steps each")
    print(f"median step: plain Horovod {plain * 1e3:.2f} ms, crossover (no peer) "
          f"{crossed * 1e3:.2f} ms, ratio {crossed / plain:.4f}")
    for variant, times in step_times.items():  # run-to-run spread = the noise floor
        print(f"  {variant} runs (ms): {', '.join(f'{t * 1e3:.2f}' for t in times)}")


if __name__ == "__main__":
    main()
