"""Leaving a lease for good: the one place that gives up the link turn and the device.

Why one place: every way a job stops stepping (training's end, a step that failed, a fit that
failed between steps, strategy.leave_device()) must end both, in this order, and an error
leaving the link turn must not keep the device from the peer job.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crossover_tf.lease.device_lease import DeviceLease
    from crossover_tf.lease.link_turn import LinkTurn


def leave(lease: "DeviceLease | None", link_turn: "LinkTurn | None") -> None:
    """Leaves the link turn and gives up the device (each if there is one), for good: a turn
    left for a pause (the last epoch's end) is not resumed by the next fit's first epoch,
    which would join before that fit's broadcast and compile; it joins at its first step."""
    try:
        if link_turn is not None:
            link_turn.leave()
    finally:  # an error leaving the link turn must not keep the device from the peer job
        if lease is not None:
            lease.yield_device()
