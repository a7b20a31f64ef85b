"""A custom GradientTape loop, crossed (strategy.hold_device + strategy.gradient_tape) or as
plain Horovod (hvd.DistributedGradientTape); writes what it saw as JSON.

Run under `horovodrun --gloo` by tests/multiprocess/test_custom_loop.py; the two loops differ
only in the crossing lines. With --misuse (one process) it tries the mistakes the API must
refuse and records each error.

  custom_loop_worker.py OUT [--group G] [--plain] [--steps N] [--barrier DIR:N] [--misuse]
                        [--link_turn POSITION] [--in_run] [--bucket_bytes B]

With --link_turn the crossed loop also takes link turns: its tape joins them on its first
allreduce, as no Keras step runs to do it. With --in_run the crossed step runs inside
strategy.run, and the worker records the DeprecationWarnings crossover_tf gave. The crossed
loop also records how its traced step orders the mid-step yield and the gradient allreduce's
collectives (overlap_structure), with --bucket_bytes as CommunicationOptions.bucket_bytes.
"""
from __future__ import annotations

import argparse
import json
import os
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from experiments.barrier import wait_at_barrier  # noqa: E402
from strategy_worker import FEATURES, build_model, global_dataset  # noqa: E402


def crossed_step(strategy, model, optimizer, loss_fn, in_run: bool = False):
    """The crossed step; in_run: called inside strategy.run, as a loop ported to the
    2026-12-04 docs wrote it (deprecated: the hold and tape there are no-ops that warn)."""
    def step(x, y):
        with strategy.hold_device():
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            tape = strategy.gradient_tape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    if in_run:
        return tf.function(lambda x, y: strategy.run(step, args=(x, y)))
    return tf.function(step)


def overlap_structure(graph) -> dict:
    """How a traced crossed step orders its mid-step yield (the step's first
    CrossoverYieldLease) and its gradient collectives: how many collectives, whether the yield
    waits for any of them (the device held while waiting on the network) and whether any of
    them waits for the yield (no overlap with the backward pass)."""
    from crossover_tf._hold.custom_loop import COLLECTIVE_OPS
    ops = graph.get_operations()
    collectives = [op for op in ops if op.type in COLLECTIVE_OPS]
    mid_yield = next(op for op in ops if op.type == "CrossoverYieldLease")

    def ancestors(op) -> set:
        seen, todo = set(), [op]
        while todo:
            current = todo.pop()
            for parent in [t.op for t in current.inputs] + list(current.control_inputs):
                if parent.name not in seen:
                    seen.add(parent.name)
                    todo.append(parent)
        return seen

    before_yield = ancestors(mid_yield)
    return {"collectives": len(collectives),
            "yield_waits_for_collective": any(c.name in before_yield for c in collectives),
            "collective_waits_for_yield": any(mid_yield.name in ancestors(c)
                                              for c in collectives)}


def plain_communicator(backend: str):
    """The plain loop's ranks and its gradient average, written as a user of each library
    would: Horovod's grouped allreduce, or TensorFlow's collectives through the backend."""
    if backend == "horovod":
        import horovod.tensorflow as hvd
        from crossover_tf._communication.horovod import HorovodCommunicator
        hvd.init()
        return (HorovodCommunicator(init=False),
                lambda grads: hvd.grouped_allreduce(grads, op=hvd.Average))
    from crossover_tf._communication.tensorflow import TensorFlowCommunicator
    comm = TensorFlowCommunicator()
    comm.start()
    return comm, lambda grads: comm.allreduce(grads, mean=True, name="plain_grads")


def plain_step(model, optimizer, loss_fn, average):
    # hvd.DistributedGradientTape keys gradients by tf.Variable.ref(), which Keras 3 variables
    # lack: a plain Horovod loop on Keras 3 averages the tape's gradients itself.
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = average(tape.gradient(loss, model.trainable_variables))
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return step


def misuse(strategy, model, optimizer, loss_fn) -> tuple[dict[str, str], dict[str, float]]:
    """Each mistake's error message (or "no error"), and the lease's statistics after them."""
    x = tf.zeros((4, FEATURES))
    y = tf.zeros((4,), tf.int32)

    traced = []  # kept alive: the lease's statistics live as long as a kernel using it

    def attempt(body) -> str:
        traced.append(tf.function(body))
        try:
            traced[-1](x, y)
        except (RuntimeError, ValueError) as err:
            return str(err)
        return "no error"

    def forgot_hold(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return strategy.gradient_tape(tape).gradient(loss, model.trainable_variables)

    def horovod_tape_in_hold(x, y):
        import horovod.tensorflow as hvd
        with strategy.hold_device():
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = hvd.DistributedGradientTape(tape).gradient(
                loss, [v.value for v in model.trainable_variables])
            optimizer.apply_gradients(zip(grads, model.trainable_variables))

    def reduce_in_hold(x, y):
        with strategy.hold_device():
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = strategy.gradient_tape(tape).gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return strategy.reduce("MEAN", loss)  # a metric's collective, inside the hold

    def xla_compute_in_hold(x, y):
        forward = tf.function(lambda x: model(x, training=True), jit_compile=True)
        with strategy.hold_device():
            with tf.GradientTape() as tape:
                loss = loss_fn(y, forward(x))
            grads = strategy.gradient_tape(tape).gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))

    errors = {"forgot_hold": attempt(forgot_hold),
              "horovod_tape_in_hold": attempt(horovod_tape_in_hold),
              "reduce_in_hold": attempt(reduce_in_hold),
              "xla_compute_in_hold": attempt(xla_compute_in_hold)}
    return errors, strategy.lease_stats()  # read while the traced functions live


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--group", default="")
    parser.add_argument("--jobs", type=int, default=1, help="jobs in the crossover group")
    parser.add_argument("--plain", action="store_true", help="plain Horovod, no strategy")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--barrier", default="", help="DIR:N - wait until N processes arrive")
    parser.add_argument("--misuse", action="store_true")
    parser.add_argument("--backend", default="horovod", help="CommunicationOptions.backend")
    parser.add_argument("--link_turn", type=int, default=-1,
                        help="LinkTurnOptions.position (-1: no link turns)")
    parser.add_argument("--in_run", action="store_true",
                        help="the crossed step inside strategy.run (the 2026-12-04 port)")
    parser.add_argument("--bucket_bytes", type=int, default=None,
                        help="CommunicationOptions.bucket_bytes (default: its own)")
    args = parser.parse_args()

    import crossover_tf
    link_turn = (crossover_tf.LinkTurnOptions(args.link_turn, wait_s=60)
                 if args.link_turn >= 0 else None)
    strategy = None if args.plain else crossover_tf.CrossoverStrategy(
        args.group, lease=crossover_tf.LeaseOptions(jobs=args.jobs, timeout_s=60),
        link_turn=link_turn,
        communication=crossover_tf.CommunicationOptions(
            backend=args.backend, collective_timeout_s=120,
            **({} if args.bucket_bytes is None else {"bucket_bytes": args.bucket_bytes})))
    comm, average = plain_communicator(args.backend) if strategy is None else (None, None)
    rank, size = (comm.rank, comm.size) if strategy is None else (strategy.rank, strategy.size)
    keras.utils.set_random_seed(7 + rank)  # different init per rank: the broadcast fixes it
    model = build_model(bad_xla=False)
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    variables = model.variables + optimizer.variables
    if strategy is None:
        # hvd.broadcast_variables assigns to tf.Variables, not Keras 3 ones: the same
        # broadcast through the helper the strategy uses.
        comm.broadcast_variables(variables, root_rank=0)
        step = plain_step(model, optimizer, loss_fn, average)
        data = global_dataset(args.steps).map(lambda x, y: (x[rank::size], y[rank::size]))
    else:
        strategy.broadcast_variables(variables)
        step = crossed_step(strategy, model, optimizer, loss_fn, args.in_run)
        data = strategy.distribute_dataset(global_dataset(args.steps))
    result: dict = {"rank": rank}
    if args.misuse:
        result["misuse"], result["lease_stats"] = misuse(strategy, model, optimizer, loss_fn)
    else:
        losses = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DeprecationWarning)
            for i, (x, y) in enumerate(data):
                losses.append(float(step(x, y)))
                if i == 0 and args.barrier:  # line up after tracing, which differs per job
                    wait_at_barrier(args.barrier,
                                    f"{args.group}-{args.plain}-{rank}-{os.getpid()}")
        result.update(losses=losses, weights=[w.tolist() for w in model.get_weights()],
                      deprecations=[str(w.message) for w in caught
                                    if issubclass(w.category, DeprecationWarning)
                                    and "crossover_tf" in str(w.message)])
        if strategy is not None and strategy.is_crossover:
            if not args.in_run:
                result["overlap"] = overlap_structure(step.get_concrete_function(x, y).graph)
            result["lease_stats"] = strategy.lease_stats()
            result["timeline"] = strategy.lease_timeline().tolist()
        if strategy is not None and strategy.taking_link_turns:
            result["link_turn_stats"] = strategy.link_turn_stats()
            result["turn_timeline"] = strategy.link_turn_timeline().tolist()
    with open(args.out.replace("RANK", str(rank)), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
