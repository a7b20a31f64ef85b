"""Measuring a job: what its profile for the planner is made of.

`step_timer` times each step (wall and CPU), `phases` splits steps into compute, allreduce and
apply from the lease timeline, `job_record` turns both into the planner's JobStats, and
`callback.ProfileCallback` writes a job's profile from its own fit. Public runtime API: a
user's job profiles itself before it is paired (crossover_tf_planner.recommend).
"""
from crossover_tf.profiling.callback import ProfileCallback
from crossover_tf.profiling.lease_tensorboard import LeaseTensorBoard
from crossover_tf.profiling.step_timer import StepTimer, process_cpu_s

__all__ = ["LeaseTensorBoard", "ProfileCallback", "StepTimer", "process_cpu_s"]
