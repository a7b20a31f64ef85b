"""The Keras side of crossing: the train and inference steps the strategy installs on a model.

Private, as Horovod's `_keras` is. `compat.py` is the one module that touches Keras internals;
`hooks.py` installs the steps, `train_step.py` is the README's step protocol.
"""
