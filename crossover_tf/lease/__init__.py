"""The cross-process device lease: Python side of the C++ op library in ops/ (repository root).

`loader` finds the built library, `device_lease` wraps its ops, `link_turn` orders the jobs'
allreduces, `segments` names the shared memory segments (plain Python, no TensorFlow).
"""
from crossover_tf.lease.device_lease import (MAX_RESERVE_S, MAX_TIMEOUT_S, PRIORITIES,
                                             STATS_FIELDS, TAG_APPLY, TAG_COMPUTE, TAG_OTHER,
                                             DeviceLease, LeaseStats, validate_priority,
                                             validate_reserve, validate_timeout)
from crossover_tf.lease.link_turn import (LinkTurn, TurnStats, validate_turn,
                                          validate_turn_priority)
from crossover_tf.lease.loader import load_library

__all__ = ["MAX_RESERVE_S", "MAX_TIMEOUT_S", "PRIORITIES", "STATS_FIELDS", "TAG_APPLY",
           "TAG_COMPUTE", "TAG_OTHER", "DeviceLease", "LeaseStats", "LinkTurn", "TurnStats",
           "load_library", "validate_priority", "validate_reserve", "validate_timeout",
           "validate_turn", "validate_turn_priority"]
