"""The step protocol: one object per rank that every step and callback goes through.

Private. `step_protocol.StepProtocol` holds the rank's lease, link turn and communicator and
offers the protocol's verbs (hold a part, allreduce in the link turn, pause, resume, leave,
broadcast, average); `_setup.bring_up` makes it, the strategy's methods delegate to it, and
the Keras steps (`_keras/`), the custom loop's tape (`gradient_tape.py`) and the callbacks
take only it. Layers below it (`lease/`, `_hold/`, `_communication/`) never call back up.
"""
