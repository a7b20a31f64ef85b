"""The cross-process device lease: Python side of the C++ op library in ops/ (repository root).

`loader` finds the built library, `device_lease` wraps its ops, `link_turn` orders the jobs'
allreduces, `leaving` gives up both for good, `segments` resolves the lease directory and
names the segment files (plain Python, no TensorFlow), `membership` reads who is on a lease,
`group_join` waits for a group's jobs. The node's tooling (status, the exporter) is
crossover_tf.node, run as `python -m crossover_tf.lease status | exporter`.
"""
from crossover_tf._lazy import lazy_exports

# Imported on first use (crossover_tf/_lazy.py): `segments` and `membership` need no
# TensorFlow (crossover_tf.node reads leases through them), and importing them must not import
# it through this package.
_MODULES = {
    "crossover_tf.lease.device_lease": ["MAX_RESERVE_S", "MAX_TIMEOUT_S", "PRIORITIES",
                                        "TAG_APPLY", "TAG_COMPUTE", "TAG_OTHER", "DeviceLease",
                                        "LeaseStats", "validate_priority", "validate_reserve",
                                        "validate_timeout"],
    "crossover_tf.lease.group_join": ["GroupIncomplete", "GroupOverfull"],
    "crossover_tf.lease.leaving": ["leave"],
    "crossover_tf.lease.link_turn": ["LinkTurn", "LinkTurnStats", "validate_link_turn",
                                     "validate_link_turn_priority"],
    "crossover_tf.lease.loader": ["load_library"],
    "crossover_tf.lease.membership": ["LeaseSnapshot", "Member", "Waiter", "validate_job"],
    "crossover_tf.lease.segments": ["LeaseDirError", "resolve_lease_dir"],
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
# The stable API. The validators, limits and the loader above are importable here too, but
# belong to their modules, where they may change. (Renamed in issue 36, with no alias:
# TurnStats -> LinkTurnStats, validate_turn* -> validate_link_turn*, DeviceLease.release ->
# DeviceLease.yield_device: "yield" is the mid-step hand-back, "leave" is for good.)
__all__ = ["DeviceLease", "GroupIncomplete", "GroupOverfull", "LeaseDirError", "LeaseSnapshot",
           "LeaseStats", "LinkTurn", "LinkTurnStats", "Member", "TAG_APPLY", "TAG_COMPUTE",
           "TAG_OTHER", "Waiter", "resolve_lease_dir"]
