"""Holding the device for one part of a step: acquire, run the part, yield.

Private: `device_hold.run_holding_device` serves the Keras steps, and `custom_loop.DeviceHold`
is what `strategy.hold_device()` returns to custom training loops.
"""
