"""The cross-process device lease: Python side of the C++ op library in ops/ (repository root).

`loader` finds the built library, `device_lease` wraps its ops, `link_turn` orders the jobs'
allreduces, `segments` resolves the lease directory and names the segment files (plain Python,
no TensorFlow), `membership` reads who is on a lease, `group_join` waits for a group's jobs,
`status` is `python -m crossover_tf.lease status`.
"""
from crossover_tf.lease.device_lease import (MAX_RESERVE_S, MAX_TIMEOUT_S, PRIORITIES,
                                             TAG_APPLY, TAG_COMPUTE, TAG_OTHER,
                                             DeviceLease, LeaseStats, validate_priority,
                                             validate_reserve, validate_timeout)
from crossover_tf.lease.group_join import GroupIncomplete
from crossover_tf.lease.link_turn import (LinkTurn, TurnStats, validate_turn,
                                          validate_turn_priority)
from crossover_tf.lease.loader import load_library
from crossover_tf.lease.membership import LeaseSnapshot, Member, Waiter, validate_job
from crossover_tf.lease.segments import LeaseDirError, resolve_lease_dir

__all__ = ["MAX_RESERVE_S", "MAX_TIMEOUT_S", "PRIORITIES", "TAG_APPLY",
           "TAG_COMPUTE", "TAG_OTHER", "DeviceLease", "GroupIncomplete", "LeaseDirError",
           "LeaseSnapshot", "LeaseStats", "LinkTurn", "Member", "TurnStats", "Waiter",
           "load_library", "resolve_lease_dir", "validate_job", "validate_priority",
           "validate_reserve", "validate_timeout", "validate_turn", "validate_turn_priority"]
