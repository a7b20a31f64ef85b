"""Per-step cost of CrossoverStrategy for a job alone on its device, against the same strategy
with no group (plain data parallelism), and where it comes from, measured side by side in one
process.

  python -m benchmarks.strategy_overhead [--model small_cnn] [--rounds 12] [--steps 40]

Three variants of one model are built once, each compiled with XLA and fit as a user fits it:
  keras      Keras's own fit, no strategy: the whole step one XLA cluster;
  plain      CrossoverStrategy() with no group: the step split into compute and apply (two XLA
             clusters around the allreduce), no lease;
  crossover  a lone job (its group declares one job, LeaseOptions(jobs=1)): the same split, with
             the device lease's acquire and yield around each part.
Then `--rounds` rounds fit each variant `--steps` steps, in an order rotated every round so
that drift hits all alike; a round's figure is its median step (batch end to batch end). Why
rounds of one process, not a process per run: separate builds of the same model differ by
2-3% in step time (memory layout, thread placement), which hid a cost of a few tenths of a
percent under noise ten times its size.

It prints each variant's median step, crossover / plain (the lease's cost, goal < 1.01 in every
round) and plain / keras (the split's cost), each as the median [min–max] over the rounds.

Rounds of fit still drift by several percent between rounds on a shared machine, so a second
phase interleaves single steps (`--pairs` of them, model.train_on_batch on one batch, the
variants' order alternating): a step of the lone crossover job right beside a step of plain,
which pins the lease's cost per step to a few microseconds (the median difference with its
95% bootstrap interval). Last, what one read of the lease statistics costs (a per-step timer
such as StepTimer makes one a step).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import time
import uuid
from typing import Any, Callable, Sequence

import numpy as np

from benchmarks.common import median_range, parse_args

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

VARIANTS = ("keras", "plain", "crossover")
# Seconds after TensorFlow's start: two short rounds of a small model.
SHORT = {"model": "mlp", "steps": 8, "skip_steps": 2, "rounds": 2, "pairs": 20}


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--dataset", default="synthetic:mnist")
    parser.add_argument("--global_batch_size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=40, help="steps per variant per round")
    parser.add_argument("--skip_steps", type=int, default=3,
                        help="leading steps of each fit left out (the fit's own start)")
    parser.add_argument("--pairs", type=int, default=600,
                        help="single steps of plain and crossover interleaved (train_on_batch)")
    parser.add_argument("--backend", default="auto", choices=("auto", "tensorflow", "horovod"))
    args = parse_args(parser, SHORT, argv)
    if args.rounds < 1 or args.pairs < 2 or args.steps <= args.skip_steps + 1:
        parser.error("--rounds must be >= 1, --pairs >= 2 and --steps > --skip_steps + 1")
    return args


class BatchEnds:
    """Records when each batch ended: the same few microseconds of Python in every variant."""

    def __init__(self) -> None:
        import keras

        ends = self.ends = []

        class Callback(keras.callbacks.Callback):
            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                ends.append(time.perf_counter())

        self.callback = Callback()

    def median_step_s(self, skip: int) -> float:
        """The median time between batch ends after the first `skip` (s)."""
        return float(np.median(np.diff(self.ends[skip:])))


class Variant:
    """One variant's model, data and fit, built once and fit again every round."""

    def __init__(self, name: str, args: argparse.Namespace, group: str):
        import keras

        import crossover_tf
        import models
        from experiments import datasets
        self.name = name
        self.strategy = None
        if name != "keras":
            self.strategy = crossover_tf.CrossoverStrategy(
                group if name == "crossover" else "",
                lease=crossover_tf.LeaseOptions(jobs=1) if name == "crossover" else None,
                communication=crossover_tf.CommunicationOptions(backend=args.backend))
        spec = datasets.dataset_spec(args.dataset)
        self.data = datasets.load_dataset(args.dataset, split="train",
                                          local_batch_size=args.global_batch_size)
        with self.strategy.scope() if self.strategy else contextlib.nullcontext():
            keras.utils.set_random_seed(0)
            self.model = models.build_model(args.model, spec.image_shape, spec.num_classes)
            self.model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                               loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                               metrics=["accuracy"], jit_compile=True)

    def fit(self, steps: int, skip: int) -> float:
        """Fits `steps` steps; the median step after the first `skip` (s)."""
        ends = BatchEnds()
        if self.strategy is None:
            # Keras's own fit, past crossover_tf's guard (_keras.fit_guard refuses a model made
            # outside every scope once a crossover job is in the process): the reference.
            fit = type(self.model).fit
            fit = getattr(fit, "__wrapped__", fit)
            callbacks = [ends.callback]
        else:
            fit = type(self.model).fit
            callbacks = [*self.strategy.callbacks(), ends.callback]
        fit(self.model, self.data, steps_per_epoch=steps, epochs=1, verbose=0,
            callbacks=callbacks)
        return ends.median_step_s(skip)

    def one_step_s(self, batch: tuple[Any, Any]) -> float:
        """One train_on_batch step's wall time (s)."""
        start = time.perf_counter()
        self.model.train_on_batch(*batch)
        return time.perf_counter() - start

    def describe(self) -> str:
        """The communication backend and ranks the report names."""
        if self.strategy is None:
            return "Keras alone"
        backend = type(self.strategy.extended.comm).__module__.rsplit(".", 1)[-1]
        return f"{backend} backend, {self.strategy.size} rank"


def per_call_s(call: Callable[[], Any], calls: int = 2000) -> float:
    """Median over 5 batches of one call's time (s)."""
    call()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - start) / calls)
    return float(np.median(times))


def interleaved_steps(variants: dict[str, Variant], pairs: int) -> dict[str, np.ndarray]:
    """plain's and crossover's single steps on one batch, alternately first."""
    batch = next(iter(variants["plain"].data))
    for name in ("plain", "crossover"):  # traced and compiled for train_on_batch
        variants[name].one_step_s(batch)
    step_s: dict[str, list[float]] = {"plain": [], "crossover": []}
    for pair in range(pairs):
        for name in (("plain", "crossover") if pair % 2 == 0 else ("crossover", "plain")):
            step_s[name].append(variants[name].one_step_s(batch))
    return {name: np.asarray(times) for name, times in step_s.items()}


def median_interval(values: np.ndarray, draws: int = 2000) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the median."""
    rng = np.random.default_rng(0)
    medians = np.median(rng.choice(values, size=(draws, len(values))), axis=1)
    return float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def measure(args: argparse.Namespace) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Each variant's median step per round, and what the report names."""
    from crossover_tf.lease.segments import unlink_segment
    group = f"ovh{uuid.uuid4().hex[:8]}"
    variants = {name: Variant(name, args, group) for name in VARIANTS}
    try:
        for variant in variants.values():  # trace, compile and warm each before timing
            variant.fit(args.skip_steps + 2, 0)
        step_s: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for round_ in range(args.rounds):
            for name in VARIANTS[round_ % 3:] + VARIANTS[:round_ % 3]:
                step_s[name].append(variants[name].fit(args.steps, args.skip_steps))
        crossed = variants["crossover"].strategy
        before = crossed.lease_stats()["acquires"]
        facts = {"backend": variants["plain"].describe(),
                 "single": interleaved_steps(variants, args.pairs),
                 "acquires": int(crossed.lease_stats()["acquires"] - before),
                 "stats_read_s": per_call_s(crossed.lease_stats)}
    finally:
        crossed = variants.get("crossover")
        if crossed is not None:
            unlink_segment(group, crossed.strategy.device_key)
    return step_s, facts


def report(args: argparse.Namespace, step_s: dict[str, list[float]],
           facts: dict[str, Any]) -> None:
    """The medians, the ratios per round with their spread, and the stats read's cost."""
    medians = {name: float(np.median(times)) for name, times in step_s.items()}
    print(f"model {args.model}, global batch {args.global_batch_size}, {facts['backend']}; "
          f"{args.rounds} rounds x {args.steps - args.skip_steps - 1} timed steps per variant")
    print("median step: " + ", ".join(f"{name} {medians[name] * 1e3:.2f} ms" for name in VARIANTS)
          + f"; crossover / plain {medians['crossover'] / medians['plain']:.4f}")
    for name, times in step_s.items():  # round-to-round spread = the noise floor
        print(f"  {name} rounds (ms): {median_range([t * 1e3 for t in times])}")
    lease = [c / p for p, c in zip(step_s["plain"], step_s["crossover"])]
    split = [p / k for k, p in zip(step_s["keras"], step_s["plain"])]
    print(f"  crossover / plain per round (the lease): {median_range(lease, 4)}; "
          f"rounds under 1.01: {sum(r < 1.01 for r in lease)} of {len(lease)}")
    print(f"  plain / keras per round (the split into compute and apply): "
          f"{median_range(split, 4)}")
    single = facts["single"]
    diff_us = (single["crossover"] - single["plain"]) * 1e6
    low, high = median_interval(diff_us)
    plain_single = float(np.median(single["plain"]))
    print(f"single steps interleaved ({len(diff_us)} pairs, train_on_batch): plain "
          f"{plain_single * 1e3:.2f} ms, crossover {np.median(single['crossover']) * 1e3:.2f} ms; "
          f"crossover - plain per pair: median {np.median(diff_us):.1f} us "
          f"[95% {low:.1f} to {high:.1f}], "
          f"{np.median(diff_us) / (medians['plain'] * 1e6):.2%} of plain's fit step")
    print(f"  the crossover variant acquired the lease {facts['acquires']} times in the single "
          "steps")
    read_us = facts["stats_read_s"] * 1e6
    print(f"  one read of the lease statistics: {read_us:.1f} us "
          f"({read_us / (medians['crossover'] * 1e6):.2%} of a crossover step)")


def main(argv: Sequence[str] | None = None) -> None:
    args = arguments(argv)
    report(args, *measure(args))


if __name__ == "__main__":
    main()
