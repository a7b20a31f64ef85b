"""The comparison's settings: its flags (with the training and cluster flags it adopts from
train.py and launch_pair.py) and their validation, before anything runs."""
from __future__ import annotations

import math
import types
from typing import Any

from absl import flags

from crossover_tf_planner.policies import MEASURED
from crossover_tf_planner.registry import SCENARIOS, WITH_ENV
from experiments import config as config_lib
from experiments.comparison import budget, calibration, period_fit, scenarios

MAX_TRIALS = 20
MAX_SWEEP_POINTS = 8
MIN_PERIOD_RATIO, MAX_PERIOD_RATIO = 0.25, 4.0
# train.py's flags every rank gets from the comparison (scenarios.train_command), with the
# comparison's defaults (None: train.py's).
TRAINING = {"model": "resnet20", "dataset": "synthetic:cifar10", "global_batch_size": 128,
            "steps": 40, "warmup_steps": 10, "learning_rate": None, "jit_compile": None,
            "backend": "horovod"}
# launch_pair.py's flags the comparison's cluster is built with, likewise.
CLUSTER = {"bandwidth_mbit": None, "latency_ms": None, "num_hosts": None, "timeout_s": 900.0,
           "force_localhost": None}


def _define_own(flag_values: flags.FlagValues) -> None:
    define = config_lib.flag_definer(flag_values)
    define(flags.DEFINE_string, "out_dir", "runs/compare",
           "Where results and TensorBoard logs go.")
    define(flags.DEFINE_list, "scenarios", list(MEASURED),
           f"Scenarios to run, of {', '.join(SCENARIOS)} (sequential is needed: it provides "
           "the solo profiles).")
    define(flags.DEFINE_float, "comm_to_compute", 1.0,
           "Asked-for M/C (allreduce over device time per step); the link bandwidth is "
           "calibrated to give it unless --bandwidth_mbit is set.")
    define(flags.DEFINE_integer, "trials", 1,
           f"Runs of every scenario (1..{MAX_TRIALS}), in the orders of a Williams design: a "
           "multiple of the scenario count balances positions (compare.md says when not).")
    define(flags.DEFINE_list, "sweep_comm_to_compute", [],
           f"M/C ratios (up to {MAX_SWEEP_POINTS}) to run the calibrated comparison at; "
           "writes sweep.{json,md,png}.")
    define(flags.DEFINE_float, "calibration_mbit", 100.0,
           "First calibration bandwidth (the next ones are chosen from the results).")
    define(flags.DEFINE_integer, "calibration_timed_steps", 20,
           "Timed steps (after --warmup_steps) of each solo calibration run.")
    define(flags.DEFINE_float, "budget_minutes", 0.0,
           "The comparison's time budget (0: none): after calibration, every run's --steps is "
           "shortened so that the estimated length fits (never below warm-up + "
           f"{budget.MIN_TIMED_STEPS} timed steps; never fewer trials).")
    define(flags.DEFINE_boolean, "drift_probe", True,
           "Run the same short solo run of job A before and after the trials (with "
           "--calibration_timed_steps), so the report says whether the machine slowed.")
    define(flags.DEFINE_integer, "jobs", 2,
           f"Jobs sharing the hosts (2..{len(scenarios.JOB_NAMES)}), named A, B, ...")
    define(flags.DEFINE_integer, "secondary_micro_batches", 4,
           "Priority scenario: micro-batches per step of the secondary job (B).")
    define(flags.DEFINE_boolean, "comm_cpu_probe", True,
           "Measure what an allreduce costs the shared CPU core and what the link loses "
           "to allreduces overlapping at random (about 2 minutes, probes/comm_cpu.py) for the "
           "planner's prediction.")
    define(flags.DEFINE_float, "contention_probe_seconds", 20.0,
           "How long the link contention probe times one job alone (two jobs: twice that).")
    define(flags.DEFINE_boolean, "horovod_timelines", False,
           "Profiling only: write every job's Horovod timeline (rank 0) next to its stats.json; "
           "attribution.md then splits each allreduce into waiting for the other ranks and the "
           "transfer. Horovod's timeline writer thread spins (a yield loop), taking much of a "
           "CPU device: the throughput numbers of such a run are not comparable.")
    define(flags.DEFINE_float, "period_ratio", 0.0,
           "Asked-for T_B/T_A (0: job B is job A's twin): job B's global batch is calibrated by "
           "short solo runs at the comparison's link so that its step is this multiple of job "
           f"A's within ±{period_fit.TOLERANCE:.0%}, and re-picked when a trial drifts off it; "
           "B then runs its timed steps over this ratio.")
    define(flags.DEFINE_list, "sweep_period_ratio", [],
           f"T_B/T_A ratios (up to {MAX_SWEEP_POINTS}) to run the comparison at, job B shaped "
           "to each as --period_ratio does, on one link; writes shift.{json,md}: each scenario "
           "over naive against the planner's prediction made before the trials.")
    define(flags.DEFINE_string, "job_b_model", "",
           "Job B's model (empty: --model), e.g. to reach a --period_ratio its batch cannot.")
    define(flags.DEFINE_integer, "job_b_global_batch_size", 0,
           "Job B's global batch (0: --global_batch_size; with --period_ratio, where its "
           "calibration starts).")
    define(flags.DEFINE_list, "scenario_env", [],
           "KEY=VALUE environment for every rank of the naive_env and crossover_env scenarios "
           "(e.g. HOROVOD_CYCLE_TIME=5): a runtime setting measured side by side with naive "
           "and crossover.")


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines the comparison's flags on flag_values, once; training flags are train.py's own
    and cluster flags launch_pair.py's, with the comparison's defaults."""
    if "scenarios" in flag_values:
        return
    from experiments import launch_pair, train
    config_lib.adopt(flag_values, train.define_flags, TRAINING)
    config_lib.adopt(flag_values, launch_pair.define_flags, CLUSTER)
    _define_own(flag_values)


FLAG_NAMES = [*TRAINING, *CLUSTER, *config_lib.defined_names(_define_own)]


def _numbers(c: Any, name: str) -> list[float]:
    """A list flag as floats (a clear error for anything else)."""
    try:
        return [float(r) for r in getattr(c, name)]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be numbers, got {getattr(c, name)!r}") from None


def period_ratios(c: Any) -> list[float]:
    """--sweep_period_ratio as floats."""
    return _numbers(c, "sweep_period_ratio")


def sweep_ratios(c: Any) -> list[float]:
    """--sweep_comm_to_compute as floats."""
    return _numbers(c, "sweep_comm_to_compute")


def validate(c: Any) -> None:
    """Every setting checked, with a sentence saying what to change."""
    scenarios.train_command(c, "A", "", "", "")  # train.py validates the ranks' settings
    require = config_lib.require
    require(c.bandwidth_mbit is None or c.bandwidth_mbit > 0, "bandwidth_mbit must be positive")
    require(c.num_hosts >= 2, "num_hosts must be >= 2: one host has no network")
    require(c.global_batch_size % c.num_hosts == 0,
            "global_batch_size must be divisible by num_hosts")
    require(c.steps - c.warmup_steps >= 10, "need at least 10 timed steps")
    require(c.contention_probe_seconds >= 2.0,
            "contention_probe_seconds must be >= 2 (the probe's shortest run)")
    require(c.backend != "auto", "--backend must name horovod or tensorflow: the comparison "
            "starts every rank itself, by that backend's launcher")
    require(c.backend == "horovod" or not c.horovod_timelines,
            "--horovod_timelines needs --backend=horovod (TensorFlow's collectives write none)")
    _validate_scenarios(c)
    require(1 <= c.trials <= MAX_TRIALS, f"trials must be in 1..{MAX_TRIALS}, got {c.trials}")
    _validate_regime(c)
    _validate_job_b(c)


def _validate_scenarios(c: Any) -> None:
    require = config_lib.require
    unknown = sorted(set(c.scenarios) - set(SCENARIOS))
    require(not unknown, f"unknown scenarios {unknown}; choose from {SCENARIOS}")
    require("sequential" in c.scenarios,
            "the sequential scenario is required (it gives the solo profiles)")
    require(2 <= c.jobs <= len(scenarios.JOB_NAMES),
            f"jobs must be in 2..{len(scenarios.JOB_NAMES)}, got {c.jobs}")
    require("priority" not in c.scenarios or c.jobs == 2,
            "the priority scenario runs one primary and one secondary: --jobs=2")
    require("shift" not in c.scenarios or (c.jobs == 2 and c.warmup_steps >= 1),
            "the shift scenario starts job B at a shift from job A after the warm-up's "
            "barrier: --jobs=2 and --warmup_steps >= 1")
    require(c.secondary_micro_batches >= 1
            and (c.global_batch_size // c.num_hosts) % c.secondary_micro_batches == 0,
            f"secondary_micro_batches must divide each rank's batch "
            f"({c.global_batch_size // max(c.num_hosts, 1)}), got {c.secondary_micro_batches}")
    env = scenarios.parse_env(c.scenario_env)
    require(bool(env) == bool(set(WITH_ENV) & set(c.scenarios)),
            f"--scenario_env and the {' / '.join(WITH_ENV)} scenarios go together: name at "
            "least one of them and give at least one KEY=VALUE")


def _validate_regime(c: Any) -> None:
    require = config_lib.require
    require(math.isfinite(c.comm_to_compute) and c.comm_to_compute > 0,
            f"comm_to_compute must be a positive number, got {c.comm_to_compute}")
    ratios = sweep_ratios(c)
    require(all(math.isfinite(r) and r > 0 for r in ratios),
            f"sweep_comm_to_compute ratios must be positive, got {ratios}")
    require(len(ratios) <= MAX_SWEEP_POINTS and len(set(ratios)) == len(ratios),
            f"sweep_comm_to_compute takes up to {MAX_SWEEP_POINTS} distinct ratios, got "
            f"{ratios}")
    require(not ratios or c.bandwidth_mbit is None,
            "sweep_comm_to_compute calibrates the bandwidth per ratio; drop --bandwidth_mbit")
    require(not ratios or ({"naive", "crossover"} <= set(c.scenarios) and c.jobs == 2),
            "sweep_comm_to_compute compares a crossover pair with naive and sequential: run "
            "those scenarios with --jobs=2")
    require(c.bandwidth_mbit is not None or not c.force_localhost,
            "calibration needs shaped links; force_localhost has none, so set "
            "--bandwidth_mbit (it is then not applied) or drop force_localhost")
    lowest = calibration.MIN_MBIT * calibration.MIN_STEP
    require(lowest <= c.calibration_mbit <= calibration.MAX_MBIT,
            f"calibration_mbit must be in [{lowest:g}, {calibration.MAX_MBIT:g}], got "
            f"{c.calibration_mbit}")
    require(math.isfinite(c.budget_minutes) and c.budget_minutes >= 0,
            f"budget_minutes must be >= 0 (0: no budget), got {c.budget_minutes}")
    require(c.calibration_timed_steps >= 5,
            f"calibration_timed_steps must be >= 5, got {c.calibration_timed_steps}")


def _validate_job_b(c: Any) -> None:
    require = config_lib.require
    swept = period_ratios(c)
    require(not swept or not (c.period_ratio or sweep_ratios(c)),
            "sweep_period_ratio sets job B's period ratio itself: drop --period_ratio and "
            "--sweep_comm_to_compute")
    require(len(swept) <= MAX_SWEEP_POINTS and len(set(swept)) == len(swept),
            f"sweep_period_ratio takes up to {MAX_SWEEP_POINTS} distinct ratios, got {swept}")
    require(not swept or "naive" in c.scenarios,
            "sweep_period_ratio tabulates every scenario over naive: run naive")
    for ratio in swept or [c.period_ratio]:
        _validate_period_ratio(c, ratio)


def _validate_period_ratio(c: Any, ratio: float) -> None:
    require = config_lib.require
    require(math.isfinite(ratio) and (ratio == 0 or MIN_PERIOD_RATIO <= ratio <= MAX_PERIOD_RATIO),
            f"period_ratio must be 0 (job B is job A's twin) or in [{MIN_PERIOD_RATIO:g}, "
            f"{MAX_PERIOD_RATIO:g}], got {ratio}")
    require(c.job_b_global_batch_size >= 0
            and c.job_b_global_batch_size % max(c.num_hosts, 1) == 0,
            f"job_b_global_batch_size must be 0 or a positive multiple of num_hosts, got "
            f"{c.job_b_global_batch_size}")
    shaped = ratio or c.job_b_model or c.job_b_global_batch_size
    require(not shaped or c.jobs == 2,
            "--period_ratio, --job_b_model and --job_b_global_batch_size shape job B of a "
            "pair: --jobs=2")
    require(not ratio or (c.steps - c.warmup_steps) / ratio >= 10,
            f"with --period_ratio={ratio:g} job B runs (steps - warmup_steps) / "
            f"{ratio:g} timed steps: need at least 10, so steps - warmup_steps >= "
            f"{math.ceil(10 * ratio)}")
    if shaped:  # train.py validates job B's command as it will run
        scenarios.train_command(types.SimpleNamespace(**{**vars(c), "period_ratio": ratio}),
                                "B", "", "", "")


def scenario_names(c: Any) -> list[str]:
    """The scenarios asked for, in SCENARIOS' order (the first trial's)."""
    return [name for name in SCENARIOS if name in c.scenarios]
