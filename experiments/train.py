"""Trains one Horovod job with CrossoverStrategy and reports what each step cost.

  horovodrun --gloo -np 2 python -m experiments.train --job=A --group=pair0 --model=small_cnn

Every rank trains; rank 0 writes TensorBoard scalars under <model_dir>/<job>/ (loss, accuracy,
images/s, step time, lease wait and hold) and <model_dir>/<job>/stats.json (a JobStats record),
which compare.py and the planner read; every other rank r writes its own record beside it,
stats.rank<r>.json. An empty --group trains with plain Horovod (no lease):
the baseline. Launchers build this script's command line with train_argv().
"""
from __future__ import annotations

import os
import pathlib
import sys
import time
import types
from typing import Any, Mapping

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

from crossover_tf_planner.job_stats import JobStats  # noqa: E402
from experiments import config as config_lib  # noqa: E402

def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines this script's flags on flag_values (compare.py shares them)."""
    define = config_lib.flag_definer(flag_values)
    define(flags.DEFINE_string, "job", "A", "Job name; TensorBoard logs go to <model_dir>/<job>/.")
    define(flags.DEFINE_string, "group", "", "Crossover group shared with the peer job; empty = "
           "plain Horovod without a device lease.")
    define(flags.DEFINE_string, "model", "small_cnn", "Model name from the models/ registry.")
    define(flags.DEFINE_string, "dataset", "synthetic:mnist", "synthetic[:mnist|cifar10|"
           "imagenet2012], mnist, cifar10 or imagenet2012 (tfds, from --data_dir).")
    define(flags.DEFINE_string, "data_dir", None, "tensorflow-datasets directory (real datasets "
           "only; nothing is downloaded).")
    define(flags.DEFINE_integer, "global_batch_size", 64, "Batch over all ranks (split evenly).")
    define(flags.DEFINE_integer, "steps", 50, "Training steps per epoch.")
    define(flags.DEFINE_integer, "epochs", 1, "Epochs.")
    define(flags.DEFINE_integer, "warmup_steps", 5, "Leading steps left out of timing "
           "(tracing, XLA compilation, Horovod negotiation).")
    define(flags.DEFINE_float, "learning_rate", 0.01, "SGD learning rate, used as given (not "
           "scaled by the number of ranks).")
    define(flags.DEFINE_float, "momentum", 0.9, "SGD momentum.")
    define(flags.DEFINE_boolean, "jit_compile", True, "Compile compute and apply with XLA.")
    define(flags.DEFINE_string, "model_dir", "runs/train", "Where TensorBoard logs and stats go.")
    define(flags.DEFINE_integer, "seed", 0, "Seed for initial weights and data order.")
    # LeaseOptions.timeout_s's default: one default for one setting (importing crossover_tf
    # here would load TensorFlow before the flags are parsed).
    define(flags.DEFINE_float, "lease_timeout_s", 600.0, "Fail if the device lease is not "
           "granted within this time (a stuck or dead peer).")
    define(flags.DEFINE_enum, "compression", "none", "Allreduce compression.",
           enum_values=["none", "fp16"])
    define(flags.DEFINE_integer, "threads", 0, "TF intra-op threads (0: TensorFlow's default, "
           "i.e. the CPUs this process may run on).")
    define(flags.DEFINE_integer, "log_every", 1, "Write TensorBoard step scalars every N steps.")
    define(flags.DEFINE_string, "start_barrier", "", "DIR:COUNT: wait before training until "
           "COUNT processes (all ranks of all jobs meant to run together) arrived, and again "
           "after --warmup_steps, so that their timed steps start together.")
    define(flags.DEFINE_float, "start_shift_s", 0.0, "Wait this long after the timed-start "
           "barrier before the first timed step: the static start shift of the comparison's "
           "shift scenario (crossover_tf_planner/shift_rule.py), set once, never corrected.")
    define(flags.DEFINE_integer, "memory_limit_mb", 0, "GPU only: cap this job's GPU memory "
           "at this many MiB (0: memory growth, TensorFlow takes memory as it needs it).")
    define(flags.DEFINE_enum, "priority", "normal", "Lease priority class: jobs of one class "
           "take turns; a primary never waits behind a secondary's new work.",
           enum_values=["normal", "primary", "secondary"])
    define(flags.DEFINE_integer, "micro_batches", 1, "Compute each step as this many equal "
           "micro-batches, each under its own hold (a secondary's bound on a primary's wait).")
    define(flags.DEFINE_integer, "link_turn", -1, "This job's position in its group's "
           "allreduce order (0, 1, ...; -1: none): the group's jobs then allreduce one at a "
           "time (crossover_tf.lease.link_turn).")
    define(flags.DEFINE_integer, "group_jobs", 2, "How many jobs the crossover group has: "
           "each waits at start until that many jobs are on its device's lease, and fails "
           "otherwise (1: a job meant to run alone). Link turns use the same count.")
    define(flags.DEFINE_float, "join_timeout_s", 120.0, "The longest a job waits at start "
           "for the group's other jobs.")
    define(flags.DEFINE_string, "lease_dir", "", "Directory of the lease segments, seen by "
           "every job of the group (empty: $CROSSOVER_LEASE_DIR, else /dev/shm).")
    define(flags.DEFINE_enum, "backend", "auto",
           "Communication backend: Horovod (ranks from horovodrun) or TensorFlow's collectives "
           "(ranks from TF_CONFIG, Slurm, or python -m crossover_tf.launch); auto: Horovod in "
           "a rank that horovodrun started, TensorFlow's collectives otherwise.",
           enum_values=["auto", "horovod", "tensorflow"])
    define(flags.DEFINE_string, "horovod_timeline", "", "Write Horovod's timeline (rank 0, "
           "chrome://tracing JSON) to this file; analysis/horovod_timeline.py reads it.")


FLAG_NAMES = config_lib.defined_names(define_flags)


def validate(c: Any) -> None:
    """Clear errors for settings that would otherwise fail deep inside TF or Horovod."""
    import models  # local: keeps --help fast
    from experiments import datasets
    config_lib.require(c.model in models.available_models(),
                       f"unknown model {c.model!r}; choose one of: "
                       f"{', '.join(models.available_models())}")
    datasets.dataset_spec(c.dataset)  # raises ValueError listing the choices
    config_lib.require(c.global_batch_size > 0, f"global_batch_size must be positive, got "
                       f"{c.global_batch_size}")
    config_lib.require(c.steps > 0, f"steps must be positive, got {c.steps}")
    config_lib.require(c.epochs > 0, f"epochs must be positive, got {c.epochs}")
    config_lib.require(0 <= c.warmup_steps < c.steps * c.epochs,
                       f"warmup_steps must be in [0, steps*epochs), got {c.warmup_steps}")
    config_lib.require(c.learning_rate > 0, f"learning_rate must be positive, got "
                       f"{c.learning_rate}")
    config_lib.require(c.lease_timeout_s > 0, "lease_timeout_s must be positive")
    config_lib.require(c.threads >= 0, "threads must be >= 0")
    config_lib.require(c.start_shift_s == 0 or (c.start_shift_s > 0 and c.start_barrier
                                                and c.warmup_steps >= 1),
                       f"start_shift_s shifts the timed start of jobs that run together: it "
                       f"must be >= 0 and, when set, needs --start_barrier and --warmup_steps "
                       f">= 1, got {c.start_shift_s}")
    config_lib.require(c.memory_limit_mb >= 0, "memory_limit_mb must be >= 0 (0: growth)")
    config_lib.require(c.micro_batches >= 1, "micro_batches must be >= 1")
    config_lib.require(c.global_batch_size % c.micro_batches == 0,
                       f"global_batch_size {c.global_batch_size} must divide into "
                       f"micro_batches={c.micro_batches} equal micro-batches")
    config_lib.require(bool(c.job) and "/" not in c.job, f"bad job name {c.job!r}")
    config_lib.require(c.link_turn < 0 or bool(c.group),
                       "link_turn orders a crossover group's allreduces: set --group too")
    config_lib.require(c.backend == "horovod" or (c.compression == "none"
                                                  and not c.horovod_timeline),
                       "--compression and --horovod_timeline are Horovod's: give "
                       "--backend=horovod with them (TensorFlow's collectives, which "
                       "--backend=auto picks outside horovodrun, have neither)")
    _options(c)  # the strategy's option groups refuse what would be dropped or cannot work


def settings(flag_values: flags.FlagValues = flags.FLAGS,
             overrides: Mapping[str, Any] | None = None) -> types.SimpleNamespace:
    """This script's settings: flag values with overrides on top, validated."""
    define_flags(flag_values)
    return config_lib.resolve(flag_values, FLAG_NAMES, overrides, validate, "train")


def train_argv(overrides: Mapping[str, Any]) -> list[str]:
    """The command that runs this script with these settings (the rest at its defaults).

    Validated exactly as the script validates its command line, so a bad setting fails in
    the launcher rather than in every rank.
    """
    fresh = flags.FlagValues()  # this script's own defaults, whatever the caller's flags say
    resolved = settings(fresh, overrides)
    return [sys.executable, "-m", "experiments.train",
            *(f"--{name}={value}" for name, value in vars(resolved).items() if value is not None)]


def run(flag_values: flags.FlagValues = flags.FLAGS,
        overrides: Mapping[str, Any] | None = None) -> JobStats:
    """Trains one job (this process is one of its ranks); returns its statistics."""
    c = settings(flag_values, overrides)
    import keras

    from experiments import datasets
    from experiments.step_statistics import StepStatistics

    _set_threads(c.threads)
    if c.horovod_timeline:  # read by hvd.init, which the strategy calls
        pathlib.Path(c.horovod_timeline).parent.mkdir(parents=True, exist_ok=True)
        os.environ["HOROVOD_TIMELINE"] = c.horovod_timeline
    strategy = _strategy(c)
    if c.global_batch_size % strategy.size:
        raise ValueError(f"global_batch_size {c.global_batch_size} is not divisible by the "
                         f"{strategy.size} ranks")
    keras.utils.set_random_seed(c.seed)
    train_data = strategy.distribute_datasets_from_function(
        lambda context: datasets.load_dataset(
            c.dataset, split="train", local_batch_size=c.global_batch_size // strategy.size,
            num_shards=context.num_input_pipelines, shard_index=context.input_pipeline_id,
            seed=c.seed, data_dir=c.data_dir))
    model = _compiled_model(c, strategy)
    job_dir = pathlib.Path(c.model_dir) / c.job
    step_stats = StepStatistics(strategy, c.global_batch_size, str(job_dir), c.log_every,
                                description=_description(c, strategy))
    barriers = []
    if c.start_barrier:
        from experiments import barrier
        me = f"{c.job}-{strategy.rank}"
        barrier.wait_at_barrier(barrier.phase(c.start_barrier, "start"), me)
        if c.warmup_steps:  # the timed steps of every job start together too
            barriers.append(barrier.TimedStartBarrier(barrier.phase(c.start_barrier, "timed"),
                                                      me, c.warmup_steps, strategy,
                                                      shift_s=c.start_shift_s))
    start_ns = time.time_ns()
    model.fit(train_data, epochs=c.epochs, steps_per_epoch=c.steps, verbose=0,
              callbacks=[*strategy.callbacks(micro_batches=c.micro_batches), *barriers,
                         step_stats])
    stats = _job_stats(c, strategy, model, step_stats.records, start_ns, time.time_ns())
    job_dir.mkdir(parents=True, exist_ok=True)
    stats.to_json(job_dir / stats_file_name(strategy.rank))
    logging.info("job %s rank %d: %.1f images/s, median step %.1f ms", c.job, strategy.rank,
                 stats.images_per_s, 1e3 * stats.step_time_s)
    return stats


def stats_file_name(rank: int) -> str:
    """Rank 0's record is the job's stats.json; every other rank saves its own beside it, so
    that attribute.py can tell a rank waiting for the other host's rank from a slow transfer."""
    return "stats.json" if rank == 0 else f"stats.rank{rank}.json"


def _description(c: types.SimpleNamespace, strategy: Any) -> dict[str, str]:
    """What TensorBoard shows about this job, so runs of N jobs side by side say which is which
    (and which one is the primary)."""
    return {"job": c.job, "lease group": c.group or "(none: no lease)",
            "priority": c.priority, "micro-batches per step": str(c.micro_batches),
            "jobs in the group": str(c.group_jobs),
            "link turn": f"{c.link_turn}" if c.link_turn >= 0 else "(none)",
            "ranks": str(strategy.size), "model": c.model,
            "global batch": str(c.global_batch_size)}


def _set_threads(threads: int) -> None:
    """Caps TensorFlow's thread pools (0: leave TensorFlow's default)."""
    if threads:
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))


def _options(c: types.SimpleNamespace) -> dict[str, Any]:
    """The strategy's option groups from the settings (checked as they are made)."""
    from crossover_tf import options
    lease = options.LeaseOptions(
        jobs=c.group_jobs, join_timeout_s=c.join_timeout_s, timeout_s=c.lease_timeout_s,
        priority=c.priority, lease_dir=c.lease_dir or None, job=c.job)
    link_turn = (options.LinkTurnOptions(position=c.link_turn) if c.link_turn >= 0 else None)
    options.check_combination(c.group, lease, link_turn)
    return {"lease": lease, "link_turn": link_turn,
            "device": options.DeviceOptions(memory=c.memory_limit_mb or "growth")}


def _strategy(c: types.SimpleNamespace) -> Any:
    import crossover_tf
    if c.backend != "horovod":  # "tensorflow", or "auto" (which logs what it picks)
        communication = crossover_tf.CommunicationOptions(backend=c.backend)
    else:
        import horovod.tensorflow as hvd
        communication = crossover_tf.CommunicationOptions(
            backend="horovod", compression=hvd.Compression.fp16 if c.compression == "fp16"
            else hvd.Compression.none)
    return crossover_tf.CrossoverStrategy(c.group, communication=communication, **_options(c))


def _compiled_model(c: types.SimpleNamespace, strategy: Any) -> Any:
    """The model, built and compiled under the strategy's scope."""
    import keras

    import models
    from experiments import datasets
    spec = datasets.dataset_spec(c.dataset)
    with strategy.scope():
        model = models.build_model(c.model, spec.image_shape, spec.num_classes)
        model.compile(optimizer=keras.optimizers.SGD(c.learning_rate, momentum=c.momentum),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], jit_compile=c.jit_compile)
    return model


def _job_stats(c: types.SimpleNamespace, strategy: Any, model: Any,
               records: list[dict[str, float]], start_ns: int, end_ns: int) -> JobStats:
    """Timing of the steps after warm-up, and each phase's median from the lease timeline
    (crossover_tf.profiling.job_record, the conversion ProfileCallback uses too)."""
    from crossover_tf.profiling import job_record
    return job_record.job_stats(
        strategy, records, job=c.job, global_batch_size=c.global_batch_size,
        warmup_steps=c.warmup_steps, start_ns=start_ns, end_ns=end_ns, group=c.group,
        priority=c.priority, micro_batches=c.micro_batches, model=c.model, dataset=c.dataset,
        jit_compile=bool(model.jit_compile), peak_device_memory_mb=_peak_device_memory_mb())


def _peak_device_memory_mb() -> float | None:
    """Peak memory TensorFlow allocated on this rank's GPU (None without a GPU)."""
    import tensorflow as tf
    if not tf.config.list_logical_devices("GPU"):
        return None
    return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20


main = config_lib.script_main(run)


if __name__ == "__main__":
    define_flags()
    app.run(main)
