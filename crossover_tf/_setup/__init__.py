"""Bringing one rank up: devices, GPU neighbours, the lease, and the rank's StepProtocol.

Private: the strategy calls `bring_up.bring_up()` and keeps the StepProtocol it returns (as its
read-only `extended`, tf.distribute's name for a strategy's machinery).
"""
