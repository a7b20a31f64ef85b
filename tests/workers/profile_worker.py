"""A user's job that profiles itself with crossover_tf.ProfileCallback (the five lines a script
adds), run under `horovodrun --gloo` by tests/multiprocess/test_profile_callback.py.

  profile_worker.py PROFILE_JSON RESULT_JSON --group G

Writes RESULT_JSON (rank 0): each rank's profile, the steps fit ran, and the error a strategy
without a group gets.
"""
from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from strategy_worker import GLOBAL_BATCH, RecordLosses, build_model, global_dataset  # noqa: E402,E501

STEPS, WARMUP = 6, 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("profile")
    parser.add_argument("result")
    parser.add_argument("--group", required=True)
    parser.add_argument("--jobs", type=int, default=1, help="jobs in the crossover group")
    args = parser.parse_args()
    import horovod.tensorflow as hvd

    import crossover_tf
    strategy = crossover_tf.CrossoverStrategy(
        args.group, lease=crossover_tf.LeaseOptions(jobs=args.jobs, timeout_s=60))
    with strategy.scope():
        model = build_model(bad_xla=False)
    profile = crossover_tf.ProfileCallback(strategy, args.profile, steps=STEPS,
                                           warmup_steps=WARMUP, global_batch_size=GLOBAL_BATCH,
                                           stop_training=True)
    steps = RecordLosses()
    model.fit(strategy.distribute_dataset(global_dataset(40)), verbose=0,
              callbacks=[*strategy.callbacks(), profile, steps])
    try:
        crossover_tf.ProfileCallback(crossover_tf.CrossoverStrategy(""), args.profile)
        no_group_error = ""
    except ValueError as error:
        no_group_error = str(error)
    profiles = hvd.allgather_object(profile.profile.to_dict())
    if strategy.rank == 0:
        with open(args.result, "w", encoding="utf-8") as handle:
            json.dump({"profiles": profiles, "steps_ran": len(steps.losses),
                       "no_group_error": no_group_error}, handle)


if __name__ == "__main__":
    main()
