"""crossover_tf: two Horovod/Keras jobs time-share accelerators, one computing while the other
communicates (CrossoverScheduler, arXiv 2103.07974).

The runtime only: the strategy and its option groups, its train step and callbacks
(ProfileCallback writes the planner's profile of a job), and the device lease. The planner
(crossover_tf_planner) and the emulated-cluster harness (experiments/cluster) live apart.
"""
from crossover_tf.lease import DeviceLease, LeaseStats
from crossover_tf.options import (CommunicationOptions, DeviceOptions, LeaseOptions,
                                  LinkTurnOptions)
from crossover_tf.profiling import ProfileCallback
from crossover_tf.strategy import CrossoverStrategy

__version__ = "0.1.0"

__all__ = ["CommunicationOptions", "CrossoverStrategy", "DeviceLease", "DeviceOptions",
           "LeaseOptions", "LeaseStats", "LinkTurnOptions", "ProfileCallback"]
