"""The ideal crossed round, and the crossover / sequential ratio that no crossed scenario can beat.

One statistic throughout: means. Throughput is total steps over total time, so the time a
rate divides by is the mean step (the measured ratios are such rates); a median step is
shorter wherever steps are skewed by a few slow ones (1.6-3.1% shorter on the emulated
cluster), and an ideal built from medians sat on another footing than the ratios it bounds.

Why it is an upper bound: a round of crossed jobs (one step of each, as the lease's FIFO turns
give equal jobs) needs every resource below at least this long, whatever the schedule:

* the device: every job's compute + apply, one hold after another (sum of D);
* the link: every job's allreduce at its solo length, one after another, as link turns run
  them (sum of M); plain crossing's allreduces may overlap, and overlapping ones move no more
  than one alone (the link's shared efficiency, measured at or below 1 on the emulated cluster);
* each job's own step: no job steps faster than it did alone (the longest solo step).

The core's CPU is not among them. Device holds plus the comm-CPU probe's cost per allreduce
(sum of D + X) looked like one, but the main job's crossed jobs with link turns ran 1.124
[1.082-1.147] times faster than a round that long (a fresh clone, 2026-12-02): a hold's wall
time is not all CPU work, and an allreduce's CPU partly overlaps the peer's. It is kept as an
estimate (IdealRound.core_s) and shown beside the bound, never in it.

The ideal rate is one step of each job per max of those; the ideal ratio is that rate over the
measured sequential rate. It assumes the best of everything: no hand-off cost, no allreduce
slowed by a busy core, a lease hold that is all CPU work on a CPU device. A measured ratio
above it, beyond its interval, means the measurement or the bound is wrong
(comparison/trials.above_ideal).
"""
from __future__ import annotations

import numpy as np

from crossover_tf_planner import clock_steps
from crossover_tf_planner.comm_cost import CommCpu
from crossover_tf_planner.compare_record import IdealRound, Regime, Trial
from crossover_tf_planner.job_stats import JobStats
from crossover_tf_planner.validate import wire_megabytes

PHASE_COLUMNS = 5  # crossover_tf.profiling.phases: compute start/end, comm end, apply start/end


def mean_step_s(stats: JobStats) -> float:
    """A job's mean timed step: its timed wall time over its timed steps."""
    return stats.timed_wall_s / stats.timed_steps


def mean_phases_s(stats: JobStats, warmup_steps: int) -> tuple[float, float]:
    """Mean device (compute + apply) and allreduce seconds over the timed steps, from the lease
    timeline (phases_ns), leaving out the steps the wall clock stepped over (a mean takes one
    such step whole: crossover_tf_planner/clock_steps.py); a record without a timeline
    (hand-made) has only its per-step values."""
    phases = np.asarray(stats.phases_ns, dtype=np.float64).reshape(-1, PHASE_COLUMNS)
    timed = phases[warmup_steps:stats.steps] / 1e9
    stepped = clock_steps.stepped_steps(stats)[warmup_steps:warmup_steps + len(timed)]
    timed = timed[~stepped] if len(stepped) == len(timed) else timed
    if not len(timed):
        return float(stats.device_s or 0.0), float(stats.comm_s or 0.0)
    device = (timed[:, 1] - timed[:, 0]) + (timed[:, 4] - timed[:, 3])
    return float(device.mean()), float((timed[:, 2] - timed[:, 1]).mean())


def ideal_round(trial: Trial, warmup_steps: int, regime: Regime | None = None) -> IdealRound:
    """The ideal round of the trial's jobs from their solo runs (module docstring); the core's
    CPU estimate (not a bound) only where `regime` has the comm-CPU probe."""
    solos = trial.solo_stats()
    if len(solos) < 2:
        raise ValueError(f"the ideal crossover ratio needs >= 2 jobs, got {len(solos)}")
    phases = {job: mean_phases_s(s, warmup_steps) for job, s in solos.items()}
    probe = regime.comm_cpu if regime is not None else None
    core = None
    if probe:
        cost = CommCpu.from_dict(probe)
        core = sum(device + cost.comm_cpu_s(comm, wire_megabytes(trial, solos[job], regime))
                   for job, (device, comm) in phases.items())
    return IdealRound(device_s=sum(d for d, _ in phases.values()),
                      link_s=sum(m for _, m in phases.values()),
                      step_s=max(mean_step_s(s) for s in solos.values()),
                      images=float(sum(s.global_batch_size for s in solos.values())),
                      core_s=core)


def ideal_ratio(ideal: IdealRound, sequential_images_per_s: float) -> float:
    """Crossover over sequential at the ideal round: its rate over the measured sequential
    rate (the same denominator as the measured crossover / sequential)."""
    return ideal.images / ideal.round_s / sequential_images_per_s

