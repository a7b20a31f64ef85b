"""The Keras side of crossing: the train and inference steps the strategy installs on a model.

Private, as Horovod's `_keras` is. `compat.py` is the one module that touches Keras internals;
`install.py` installs the steps on a model, `train_step.py` and `inference_step.py` are the
steps (running the verbs of _protocol.StepProtocol), `first_step.py` what runs before the first,
`evaluate_average.py`, `step_errors.py` and `fit_guard.py` the averaging and the two ways a fit
that fails still leaves.
"""
