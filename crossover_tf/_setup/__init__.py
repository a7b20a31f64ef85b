"""Bringing one rank up: devices, GPU neighbours, the lease and the frozen state the steps share.

Private: the strategy calls `extended.bring_up()` and exposes its result as `strategy.extended`.
"""
