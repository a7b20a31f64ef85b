"""Where a Horovod-style custom loop's step time goes under Keras 3: Keras 3's own model, or the
crossing path (issue 60, item 2).

  python -m benchmarks.keras3_step_time [--rounds 3] [--steps 20] [--warmup 3] [--batch 8]
      [--image_size 224] [--model MobileNetV2] [--alpha 1.0] [--threads 0] [--out FILE.json]

The port of docs/coming_from_horovod.md (MobileNetV2, 224x224, batch 8 a rank, SGD) ran 0.884 s a
step under Keras 3 against 0.578 s under legacy Keras (tf_keras) on a 2-core CPU. This times the
same loop shape, one rank, no network, one synthetic batch: a `@tf.function` step of
GradientTape forward, loss and backward, then optimizer.apply_gradients, in these arms:

  tf_keras_plain    tf_keras's model, the plain TensorFlow loop;
  keras3_plain      Keras 3's model, the plain loop: against tf_keras_plain, Keras 3's own cost;
  keras3_strategy   Keras 3, the port under CrossoverStrategy() with no group (the hold and the
                    tape pass through): the strategy's cost without a lease;
  keras3_crossed    Keras 3, the port in a crossover group of one job (LeaseOptions(jobs=1)):
                    the hold's acquire, yield and re-acquire and its control dependencies
                    (every op written in the hold waits for its acquire; _hold/custom_loop.py);
  tf_keras_crossed  tf_keras, the port in a group of one: the crossing path's cost without
                    Keras 3.

`--arms` also takes diagnostic arms. keras3_fusedbn: keras3_plain with each BatchNormalization
layer computing through TensorFlow's fused kernel (FusedBatchNormV3, as tf_keras's layer does)
instead of Keras 3's own moments and normalization (a dozen element-wise and reduction ops a
layer, and their gradients, each a pass over the activations): against keras3_plain and
tf_keras_plain, how much of Keras 3's cost is its BatchNormalization. keras3_ctrl (and
tf_keras_ctrl): the plain loop with the hold's graph structure rebuilt without a lease: every
op written in the step under a control dependency on one token, the step's end waiting for
them all, variables made outside that dependency (as the hold's variable-creator scope does).
Against *_crossed, it tells the control dependencies' cost from the lease ops'.

Each arm runs in a fresh subprocess (TF_USE_LEGACY_KERAS is read when TensorFlow is imported,
and one process cannot hold both Keras), the arms interleaved for `--rounds` rounds in an
order rotated every round so that drift hits all alike. A run times `--steps` steps after
`--warmup` (the trace and the first steps), stopping early after `--max_seconds`; its steps are
timed one by one (the loss read back ends each). It prints each arm's median step with the
min–max over its timed steps of every round and the spread of the rounds' medians, then the
ratios keras3_plain / tf_keras_plain, keras3_strategy / keras3_plain, keras3_crossed /
keras3_plain and tf_keras_crossed / tf_keras_plain (the rounds' medians, median [min–max]).
Each run also counts its traced step's ops and control edges, and (unless --no_graph_stats)
the ops of the graph TensorFlow runs after grappler's rewrites, by type: where the hold's
control dependencies change what grappler fuses, it shows there. `--out` writes it all as JSON.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import inspect
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Sequence

import numpy as np

from benchmarks.common import median_range, parse_args

REPO = pathlib.Path(__file__).resolve().parent.parent
ARMS = ("tf_keras_plain", "keras3_plain", "keras3_strategy", "keras3_crossed",
        "tf_keras_crossed")
DIAGNOSTIC_ARMS = ("keras3_fusedbn", "keras3_ctrl", "tf_keras_ctrl")
# (numerator, denominator): what each ratio isolates.
RATIOS = (("keras3_plain", "tf_keras_plain", "Keras 3's own model and optimizer"),
          ("keras3_strategy", "keras3_plain", "the strategy without a lease"),
          ("keras3_crossed", "keras3_plain", "the crossing path under Keras 3"),
          ("tf_keras_crossed", "tf_keras_plain", "the crossing path under tf_keras"),
          ("keras3_plain", "keras3_fusedbn", "Keras 3's unfused BatchNormalization"),
          ("keras3_fusedbn", "tf_keras_plain", "Keras 3's cost beside its BatchNormalization"),
          ("keras3_ctrl", "keras3_plain", "the hold's control dependencies alone"),
          ("keras3_crossed", "keras3_ctrl", "the lease ops beyond the dependencies"))
# Fused kernels in the optimized graph: FusedBatchNormV3 and its gradient (tf_keras's
# BatchNormalization; Keras 3's writes a dozen ops instead), grappler's _Fused* rewrites.
FUSED = "Fused"
# Seconds of compute after TensorFlow's start (a tiny MobileNetV2): every arm once.
SHORT = {"image_size": 64, "alpha": 0.35, "batch": 4, "steps": 3, "warmup": 1, "rounds": 1,
         "classes": 10, "max_seconds": 30.0}


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per arm per round")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed steps first (the first traces the step)")
    parser.add_argument("--max_seconds", type=float, default=300.0,
                        help="an arm's timed steps stop after this long (at least one runs)")
    parser.add_argument("--model", default="MobileNetV2",
                        help="a keras.applications constructor (the same name in tf_keras)")
    parser.add_argument("--alpha", type=float, default=1.0,
                        help="width multiplier, for the models that take one")
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=8, help="the one rank's batch")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--learning_rate", type=float, default=0.01)
    parser.add_argument("--threads", type=int, default=0,
                        help="TF intra-op threads, inter-op max(2, threads), as "
                        "experiments/train.py (0: TensorFlow's default)")
    parser.add_argument("--arms", type=lambda text: tuple(text.split(",")), default=ARMS,
                        help=f"comma-separated, of {', '.join(ARMS + DIAGNOSTIC_ARMS)}")
    parser.add_argument("--no_graph_stats", action="store_true",
                        help="skip collecting the optimized graph (its first call only)")
    parser.add_argument("--out", default="", help="write every run's figures here as JSON")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)  # internal: one arm
    parser.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = parse_args(parser, SHORT, argv)
    unknown = [arm for arm in args.arms if arm not in ARMS + DIAGNOSTIC_ARMS]
    if unknown or args.rounds < 1 or args.steps < 1 or args.warmup < 1:
        parser.error(f"unknown arms {unknown}" if unknown else
                     "--rounds, --steps and --warmup must be >= 1")
    return args


# ----- one arm, in its own process -----------------------------------------------------------
def _keras(legacy: bool) -> Any:
    """tf_keras or Keras 3, whichever the arm times (TF_USE_LEGACY_KERAS is already set)."""
    if legacy:
        import tf_keras
        return tf_keras
    import keras
    return keras


def _model(k: Any, args: argparse.Namespace) -> Any:
    constructor = getattr(k.applications, args.model)
    extra = ({"alpha": args.alpha}
             if "alpha" in inspect.signature(constructor).parameters else {})
    return constructor(weights=None, input_shape=(args.image_size, args.image_size, 3),
                       classes=args.classes, **extra)


def _fuse_batch_norms(tf: Any, k: Any, model: Any) -> int:
    """Makes each Keras 3 BatchNormalization layer of model compute through FusedBatchNormV3
    (the keras3_fusedbn arm): the same statistics, one kernel a layer forward and one backward.
    Returns how many layers it changed."""
    def fused_call(layer: Any, inputs: Any, training: Any = None, mask: Any = None) -> Any:
        assert mask is None and layer.axis in (-1, len(inputs.shape) - 1), layer.name
        gamma = layer.gamma if layer.scale else tf.ones(inputs.shape[-1])
        beta = layer.beta if layer.center else tf.zeros(inputs.shape[-1])
        if training and layer.trainable:
            y, mean, variance = tf.compat.v1.nn.fused_batch_norm(
                inputs, gamma, beta, epsilon=layer.epsilon, is_training=True)
            m = layer.momentum
            layer.moving_mean.assign(layer.moving_mean * m + mean * (1.0 - m))
            layer.moving_variance.assign(layer.moving_variance * m + variance * (1.0 - m))
            return y
        return tf.compat.v1.nn.fused_batch_norm(
            inputs, gamma, beta, mean=layer.moving_mean, variance=layer.moving_variance,
            epsilon=layer.epsilon, is_training=False)[0]

    layers = [layer for layer in model.layers
              if isinstance(layer, k.layers.BatchNormalization)]
    for layer in layers:
        layer.call = fused_call.__get__(layer)
    return len(layers)


def _hold_structure(tf: Any) -> Any:
    """A context manager rebuilding the hold's graph structure without a lease (the *_ctrl
    arms): in a trace, every op written inside waits for one token's op, variables are made
    outside that dependency, and the step's end (an identity of the token) waits for every op
    written inside, as DeviceHold's closing yield does."""
    def created_outside(next_creator: Any, **kwargs: Any) -> Any:
        with tf.control_dependencies(None):
            return next_creator(**kwargs)

    @contextlib.contextmanager
    def hold():
        graph = tf.compat.v1.get_default_graph()
        token = tf.identity(tf.constant(0))
        first = len(graph.get_operations())
        with graph.control_dependencies([token]), tf.variable_creator_scope(created_outside):
            yield
        with tf.control_dependencies(graph.get_operations()[first:]):
            tf.identity(token)

    return hold


def _graph_counts(graph_def: Any) -> dict[str, Any]:
    """Op counts of a GraphDef (its function library included): all, by type, fused."""
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    types = collections.Counter(n.op for n in nodes)
    control = sum(1 for n in nodes for i in n.input if i.startswith("^"))
    return {"ops": len(nodes), "control_edges": control,
            "fused": sum(c for t, c in types.items() if FUSED in t),
            "types": dict(types.most_common())}


def run_arm(args: argparse.Namespace) -> dict[str, Any]:
    """Builds the arm's model and step, warms it up and times it (this process's one arm)."""
    arm = args.worker
    legacy = arm.startswith("tf_keras")
    import tensorflow as tf
    from tensorflow.python.eager import context
    if args.threads:  # before anything starts TensorFlow's runtime (the strategy does)
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(2, args.threads))
    k = _keras(legacy)
    strategy, group = None, ""
    if arm.endswith(("_strategy", "_crossed")):
        import crossover_tf
        if arm.endswith("_crossed"):
            group = f"k3s{uuid.uuid4().hex[:10]}"
            strategy = crossover_tf.CrossoverStrategy(group,
                                                      lease=crossover_tf.LeaseOptions(jobs=1))
        else:  # $CROSSOVER_GROUP was cleared by the parent: no group, the baseline
            strategy = crossover_tf.CrossoverStrategy()
        assert strategy.is_crossover == bool(group), (arm, strategy.is_crossover)
    k.utils.set_random_seed(0)
    model = _model(k, args)
    optimizer = k.optimizers.SGD(args.learning_rate)
    loss_of = k.losses.sparse_categorical_crossentropy
    hold = _hold_structure(tf) if arm.endswith("_ctrl") else None
    fused = _fuse_batch_norms(tf, k, model) if arm.endswith("_fusedbn") else None

    @tf.function
    def plain_step(x, y):
        with hold() if hold is not None else contextlib.nullcontext():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(loss_of(y, model(x, training=True)))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def ported_step(x, y):  # docs/coming_from_horovod.md
        with strategy.hold_device():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(loss_of(y, model(x, training=True)))
            tape = strategy.gradient_tape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step = plain_step if strategy is None else ported_step
    x = tf.random.stateless_uniform([args.batch, args.image_size, args.image_size, 3], [1, 2])
    y = tf.random.stateless_uniform([args.batch], [3, 4], maxval=args.classes, dtype=tf.int32)
    result: dict[str, Any] = {"arm": arm, "keras": k.__version__, "tensorflow": tf.__version__}

    start = time.perf_counter()
    if not args.no_graph_stats:  # the graphs are kept when the function is instantiated
        context.enable_run_metadata()
    float(step(x, y))
    result["first_step_s"] = time.perf_counter() - start
    if not args.no_graph_stats:
        metadata = context.export_run_metadata()
        context.disable_run_metadata()
        optimized = [g.post_optimization_graph for g in metadata.function_graphs
                     if len(g.post_optimization_graph.node) > 100]  # the step, not a helper
        if optimized:
            result["optimized_graph"] = _graph_counts(max(optimized, key=lambda g: len(g.node)))
    traced = step.get_concrete_function(x, y).graph
    ops = traced.get_operations()
    result["traced_graph"] = {"ops": len(ops),
                              "control_edges": sum(len(op.control_inputs) for op in ops),
                              "ops_with_control_inputs": sum(1 for op in ops if op.control_inputs)}
    for _ in range(args.warmup - 1):
        float(step(x, y))
    result["warmup_s"] = time.perf_counter() - start
    step_s: list[float] = []
    timed = time.perf_counter()
    while len(step_s) < args.steps and (not step_s or
                                        time.perf_counter() - timed < args.max_seconds):
        begin = time.perf_counter()
        float(step(x, y))
        step_s.append(time.perf_counter() - begin)
    result["step_s"] = step_s
    result["calls"] = args.warmup + len(step_s)
    result["threads"] = {"intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
                         "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
                         "cpus": os.cpu_count()}
    if strategy is not None:
        result["lease_acquires"] = strategy.lease_stats().get("acquires") if group else None
        strategy.leave_device()
    result["group"] = group
    result["fused_batch_norms"] = fused
    return result


# ----- the parent: arms interleaved, each run a fresh process ----------------------------------
def run_in_subprocess(arm: str, args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    """One run of arm in a fresh Python (its Keras chosen before TensorFlow's import); its
    group's lease segments removed after."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH",
                                                                                    "")]),
           "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
           "TF_USE_LEGACY_KERAS": "1" if arm.startswith("tf_keras") else "0"}
    env.pop("CROSSOVER_GROUP", None)  # keras3_strategy: CrossoverStrategy() with no group
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "result.json"
        command = [sys.executable, "-m", "benchmarks.keras3_step_time", *argv,
                   "--worker", arm, "--result", str(out)]
        # The timed steps are bounded by --max_seconds; TensorFlow's start and the warm-up
        # (a trace of MobileNetV2 takes a minute on a busy 2-core machine) by the rest.
        proc = subprocess.run(command, env=env, cwd=str(REPO), capture_output=True, text=True,
                              timeout=args.max_seconds + 1200)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"arm {arm} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                               f"{proc.stderr[-5000:]}")
        result = json.loads(out.read_text())
    if result.get("group"):
        from crossover_tf.lease.segments import remove_group_segments
        result["removed_segments"] = remove_group_segments([result["group"]])
    return result


def measure(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Every arm's runs, round by round, the order rotated each round."""
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in args.arms}
    arms = list(args.arms)
    for round_ in range(args.rounds):
        shift = round_ % len(arms)
        for arm in arms[shift:] + arms[:shift]:
            result = run_in_subprocess(arm, args, argv)
            runs[arm].append(result)
            print(f"round {round_}: {arm} median {np.median(result['step_s']):.4f} s "
                  f"({len(result['step_s'])} steps, first step {result['first_step_s']:.1f} s)",
                  flush=True)
    return runs


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each arm's median and min–max over all its timed steps, its rounds' medians, and each
    ratio's rounds (round i's numerator over round i's denominator)."""
    arms = {}
    for arm, results in runs.items():
        steps = [s for r in results for s in r["step_s"]]
        arms[arm] = {"median_s": float(np.median(steps)), "min_s": min(steps),
                     "max_s": max(steps), "steps": len(steps),
                     "round_medians_s": [float(np.median(r["step_s"])) for r in results]}
    ratios = {}
    for top, bottom, meaning in RATIOS:
        if top in arms and bottom in arms:
            rounds = [t / b for t, b in zip(arms[top]["round_medians_s"],
                                            arms[bottom]["round_medians_s"])]
            ratios[f"{top}/{bottom}"] = {"ratio": arms[top]["median_s"] / arms[bottom]["median_s"],
                                         "rounds": rounds, "meaning": meaning}
    return {"arms": arms, "ratios": ratios}


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]],
           summary: dict[str, Any]) -> None:
    """The table, the ratios and the graphs' op counts."""
    first = next(iter(runs.values()))[0]
    print(f"\n{args.model} alpha {args.alpha:g}, {args.image_size}x{args.image_size}, batch "
          f"{args.batch}, SGD; one rank, threads intra {first['threads']['intra_op']} inter "
          f"{first['threads']['inter_op']} ({first['threads']['cpus']} CPUs); {args.rounds} "
          f"round(s) x up to {args.steps} timed steps after {args.warmup} warm-up")
    print("| arm | Keras | median step (s) | range (s) | rounds' medians (s) | traced ops "
          "(control edges) | optimized ops (fused kernels) |")
    print("|---|---|---:|---|---|---:|---:|")
    for arm, results in runs.items():
        s = summary["arms"][arm]
        traced = results[0]["traced_graph"]
        optimized = results[0].get("optimized_graph")
        opt = f"{optimized['ops']} ({optimized['fused']})" if optimized else "-"
        print(f"| {arm} | {results[0]['keras']} | {s['median_s']:.4f} | "
              f"{s['min_s']:.4f}–{s['max_s']:.4f} | {median_range(s['round_medians_s'], 4)} | "
              f"{traced['ops']} ({traced['control_edges']}) | {opt} |")
    for name, r in summary["ratios"].items():
        print(f"{name}: {r['ratio']:.3f} (rounds {median_range(r['rounds'], 3)}; "
              f"{r['meaning']})")
    for arm, results in runs.items():  # a crossed step takes the lease twice (acquire, re-acquire)
        if results[0].get("lease_acquires") is not None:
            print(f"  {arm}: the lease acquired {sum(r['lease_acquires'] for r in results):.0f} "
                  f"times in {sum(r['calls'] for r in results)} steps")
    for arm, results in runs.items():  # what grappler's rewrites left, where arms differ
        optimized = results[0].get("optimized_graph")
        if optimized:
            top = ", ".join(f"{t} {c}" for t, c in list(optimized["types"].items())[:12])
            print(f"  {arm} optimized graph: {top}")


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = arguments(argv)
    if args.worker:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        result = run_arm(args)
        pathlib.Path(args.result).write_text(json.dumps(result))
        return
    runs = measure(args, argv)
    summary = summarize(runs)
    report(args, runs, summary)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(
            {"args": {k: v for k, v in vars(args).items() if k not in ("worker", "result")},
             **summary, "runs": runs}, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
