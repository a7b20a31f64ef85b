"""One rank of a TensorFlow-collectives job for tests/multiprocess/test_tensorflow_backend.py:
allreduces in a loop through the runtime's communicator; rank 1 dies (or stops, or raises) at
step 5 when asked, and rank 0 reports how its collective ended and after how long. With
--linger_rank R, rank R stays --linger_s seconds after its work (rank 0 saving a model, say),
and --exit_lag_s seconds more after the ranks' meeting at exit (an exit handler registered before
the communicator's runs after it: as a slow interpreter teardown on a busy machine does).

  collective_worker.py OUT [--peer exit|stop|raise] [--timeout_s T] [--steps N]
                       [--linger_rank R --linger_s S --exit_lag_s L]
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from crossover_tf._communication.tensorflow import TensorFlowCommunicator  # noqa: E402

FAIL_AT = 5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--peer", choices=["exit", "stop", "raise"], default=None)
    parser.add_argument("--timeout_s", type=float, default=10.0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--linger_rank", type=int, default=-1)
    parser.add_argument("--linger_s", type=float, default=0.0)
    parser.add_argument("--exit_lag_s", type=float, default=0.0)
    args = parser.parse_args()
    comm = TensorFlowCommunicator(timeout_s=args.timeout_s)
    if comm.rank == args.linger_rank and args.exit_lag_s:
        atexit.register(time.sleep, args.exit_lag_s)  # before start(): runs after its meeting
    comm.start()
    import tensorflow as tf
    step = tf.function(lambda t: comm.allreduce([t], mean=True, name="grads")[0])
    record = {"rank": comm.rank, "size": comm.size, "steps": 0, "error": None}
    start = time.monotonic()
    for i in range(args.steps):
        if args.peer and comm.rank == 1 and i == FAIL_AT:
            if args.peer == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            if args.peer == "raise":
                raise RuntimeError(f"rank 1 fails on purpose at step {i}")
            os._exit(9)
        try:
            value = float(step(tf.fill([1000], float(comm.rank + 1))).numpy()[0])
        except tf.errors.OpError as err:
            record["error"] = type(err).__name__
            break
        record["steps"], record["value"] = i + 1, value
    record["elapsed_s"] = time.monotonic() - start
    if record["error"] is None:  # one fused allreduce of three dtypes, and a gather
        mixed = comm.allreduce([tf.fill([3], float(comm.rank)), tf.fill([2, 2], comm.rank + 1),
                                tf.constant([comm.rank], tf.float64)], mean=False, name="mixed")
        record["mixed"] = [t.numpy().tolist() for t in mixed]
        record["gathered"] = comm.allgather_object({"rank": comm.rank, "pad": "x" * comm.rank},
                                                   "gather")
    with open(args.out.replace("RANK", str(comm.rank)), "w") as f:
        json.dump(record, f)
    if comm.rank == args.linger_rank:
        time.sleep(args.linger_s)


if __name__ == "__main__":
    main()
