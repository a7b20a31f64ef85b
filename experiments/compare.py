"""Side-by-side comparison on one emulated cluster: solo, sequential, naive, crossover.

  python -m experiments.compare                               # README's main job
  python -m experiments.compare --comm_to_compute=2 --trials=3
  python -m experiments.compare --sweep_comm_to_compute=0.5,1,2 --trials=3
  python -m experiments.compare --bandwidth_mbit=100 --model=resnet20   # fixed link, no calibration
  python -m experiments.compare --jobs=3 --comm_to_compute=2 --trials=3  # three jobs crossing
  python -m experiments.compare --scenarios=sequential,naive,priority    # primary + secondary
  python -m experiments.compare --scenarios=sequential,naive,shift,crossover_turn \
      --sweep_period_ratio=1,1.5,2 --trials=2        # shift against crossing (run_shift.sh)
  python -m experiments.compare --scenarios=sequential,naive,naive_env,crossover,crossover_env \
      --scenario_env=HOROVOD_CYCLE_TIME=5 --trials=3         # a runtime setting side by side

--jobs identical-shaped jobs A, B, ... (2 by default, up to 4; one rank per emulated host each)
are run with the same model, data and settings as:
  sequential  one job after another (each alone: these runs are also the solo profiles,
              measured with a lease nobody contends, which records each step's compute C and
              allreduce M)
  naive       all jobs at the same time, no lease (device and link simply shared)
  crossover   all jobs at the same time, sharing a device lease per host (FIFO turns)
  naive_env, crossover_env  (opt-in) naive and crossover with --scenario_env in every
              rank's environment (e.g. HOROVOD_CYCLE_TIME=5), in the same interleaved trials:
              a runtime setting measured side by side with the plain scenarios
  crossover_turn  (opt-in) crossover whose jobs also take link turns: one gradient allreduce
              at a time per host, in one global order (crossover_tf.lease.link_turn)
  shift       (opt-in, 2 jobs) naive, but job B starts its timed steps at the static shift
              CASSINI's rule picks from the latest solo runs (crossover_tf_planner/shift_rule)
  priority    (opt-in, 2 jobs) A as the primary, B as a secondary computing in
              --secondary_micro_batches micro-batches, sharing the lease: A's throughput
              against solo, B's against naive, A's worst wait against B's micro-batch

Regime: crossing pays according to M/C, and C depends on the machine. Unless --bandwidth_mbit
fixes the link, two short solo runs at two bandwidths fit M(B) = m0 + k/B
(comparison/calibration.py) and the comparison runs at the bandwidth that gives
--comm_to_compute; compare.json records the asked-for and the achieved M/C. --trials repeats
every scenario, in the orders of a Williams design (comparison/trials.py), and reports the
median with min/max of every ratio and its bootstrap 95% interval (analysis/intervals.py),
which the verdict rests on. Each trial's solo runs give its M/C: a trial more than 15% off the
asked-for one re-shapes the link for the next, and the calls rest on the trials in the regime
(analysis/regime.py); the same short solo run before and after the trials (the drift probe)
says whether the machine slowed. After calibration the comparison prints its estimated
length; --budget_minutes shortens every run to fit (comparison/budget.py).
--sweep_comm_to_compute runs the calibrated comparison at several
ratios (one sub-directory each) and writes sweep.{json,md,png}. --period_ratio shapes job B
(its batch, calibrated; --job_b_model) to that multiple of job A's period, held like M/C;
--sweep_period_ratio runs the comparison at several such ratios and writes shift.{json,md}
(scripts/run_shift.sh: shift against crossing, with the planner's call made before the runs).

The table, JSON, markdown and PNG land in --out_dir; TensorBoard runs of every scenario land
under <out_dir>/tensorboard/t<trial>_<scenario>/<job>.
"""
from __future__ import annotations

import pathlib
import time
from typing import Any, Mapping

from absl import app, flags, logging

from crossover_tf_planner.compare_record import Comparison
from experiments import config as config_lib
from experiments.comparison.run import compare_at, link_and_regime, run_period_sweep, run_sweep
from experiments.comparison.settings import (FLAG_NAMES, define_flags, period_ratios,
                                             sweep_ratios, validate)

__all__ = ["FLAG_NAMES", "declare_key_flags", "define_flags", "main", "run", "validate"]


def run(flag_values: flags.FlagValues = flags.FLAGS,
        overrides: Mapping[str, Any] | None = None) -> Comparison | dict[str, Any]:
    """The comparison (or the sweep, with --sweep_comm_to_compute: its sweep.json record);
    returns what it wrote."""
    define_flags(flag_values)
    started = time.monotonic()
    c = config_lib.resolve(flag_values, FLAG_NAMES, overrides, validate, "compare")
    if c.horovod_timelines:
        logging.warning("--horovod_timelines: Horovod's timeline writer spins on rank 0's core; "
                        "this run profiles, its throughput is not comparable to others")
    out = pathlib.Path(c.out_dir)  # compare_at and calibrate make the directories they use
    if sweep_ratios(c):
        return run_sweep(c, out, sweep_ratios(c), started)
    if period_ratios(c):
        return run_period_sweep(c, out, period_ratios(c), started)
    bandwidth, regime = link_and_regime(c, out)
    return compare_at(c, out, bandwidth, regime, started)


main = config_lib.script_main(run)


def declare_key_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Makes the comparison's flags key flags of the module calling this (compare, as the
    main module), so that --helpshort lists them: absl lists the main module's key flags, and
    counts a flag key to the module defining it, which is not this one."""
    define_flags(flag_values)
    for name in FLAG_NAMES:
        flags.declare_key_flag(name, flag_values)


if __name__ == "__main__":
    declare_key_flags()
    app.run(main)
