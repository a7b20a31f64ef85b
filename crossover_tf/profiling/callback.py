"""ProfileCallback: a user's job measures itself and writes the planner's profile.

The planner (crossover_tf_planner.recommend, crossover-plan) predicts from each job's profile
whether crossing two jobs pays, so a job must be able to produce one before it is paired:

    strategy = crossover_tf.CrossoverStrategy(
        "profile-myjob", lease=crossover_tf.LeaseOptions(jobs=1))  # alone in its own group
    with strategy.scope():
        model = build_and_compile()
    profile = crossover_tf.ProfileCallback(strategy, "myjob.json", global_batch_size=64)
    model.fit(data, callbacks=[*strategy.callbacks(), profile])

It reuses what a job already records: StepTimer's step wall and CPU times, and the lease timeline,
which splits each step into compute (the forward/backward hold), communication (from that yield to
asking for the device again: the allreduce) and apply (the update's hold); profiling.job_record
turns them into the JobStats record that train.py saves and
crossover_tf_planner.profile.profile_from_train_stats into a profile (the same path compare.py's
solo scenarios take). Only a job with a crossover group has a lease timeline; alone in its group (no
peer on its devices) the timeline is the solo one the planner needs. A job without a group is
refused at construction: its allreduce cannot be told from its compute, and a profile without that
split would mislead the planner."""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import keras

from crossover_tf.profiling import job_record
from crossover_tf.profiling.step_timer import StepTimer
from crossover_tf_planner.profile import JobProfile, profile_from_train_stats

if TYPE_CHECKING:
    from crossover_tf.strategy import CrossoverStrategy


class ProfileCallback(keras.callbacks.Callback):
    """Measures ``steps`` steps after ``warmup_steps`` (tracing, compiling, first allreduces)
    and writes the job's profile JSON to ``path`` (rank 0; every rank keeps it as
    ``self.profile``).

    Args:
      strategy: the job's CrossoverStrategy; it must have a crossover group (see the module).
      path: where rank 0 writes the profile (crossover_tf_planner.JobProfile JSON).
      steps: timed steps; their medians make the profile.
      warmup_steps: leading steps left out of timing.
      name: the job's name in the profile (default: the file name without .json).
      global_batch_size: images per step over all ranks (only images/s in the planner's
        output use it; 1 counts steps).
      stop_training: end fit once the profile is written (a profiling run).
    Profile the job alone: a peer crossing it meanwhile would stretch its phases.
    """

    def __init__(self, strategy: "CrossoverStrategy", path: str | os.PathLike, *,
                 steps: int = 20, warmup_steps: int = 3, name: str | None = None,
                 global_batch_size: int = 1, stop_training: bool = False):
        super().__init__()
        if not strategy.is_crossover:
            raise ValueError(
                "crossover_tf.ProfileCallback needs a crossover group: the lease timeline is "
                "what splits a step into compute, allreduce and apply. Give the job a group "
                "of its own, e.g. CrossoverStrategy('profile-myjob', lease=LeaseOptions(jobs=1)), "
                "and run it alone")
        if steps < 1 or warmup_steps < 0:
            raise ValueError(f"ProfileCallback: steps must be >= 1 and warmup_steps >= 0, "
                             f"got {steps} and {warmup_steps}")
        self.strategy = strategy
        self.path = os.fspath(path)
        self.steps, self.warmup_steps = steps, warmup_steps
        self.name = name or os.path.splitext(os.path.basename(self.path))[0]
        self.global_batch_size = global_batch_size
        self.stop_training = stop_training
        self.profile: JobProfile | None = None
        self._timer = StepTimer(strategy.lease_stats, global_batch_size)
        self._start_ns = 0

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._start_ns = self._start_ns or time.time_ns()

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.profile is None:
            self._timer.begin()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.profile is not None:
            return
        self._timer.end(logs)
        if len(self._timer.records) == self.warmup_steps + self.steps:
            self.profile = self._write()
            if self.stop_training:
                self.model.stop_training = True

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.profile is None:
            raise RuntimeError(
                f"crossover_tf.ProfileCallback: training ended after "
                f"{len(self._timer.records)} steps; the profile needs {self.warmup_steps} "
                f"warm-up + {self.steps} timed steps, so {self.path} was not written")

    def _write(self) -> JobProfile:
        stats = job_record.job_stats(self.strategy, self._timer.records, job=self.name,
                                     global_batch_size=self.global_batch_size,
                                     warmup_steps=self.warmup_steps, start_ns=self._start_ns,
                                     end_ns=time.time_ns(), group=self.strategy.group,
                                     priority=self.strategy.priority,
                                     micro_batches=self.strategy.micro_batches_of(self.model))
        profile = profile_from_train_stats(stats)
        if self.strategy.rank == 0:
            profile.to_json(self.path)
        return profile
