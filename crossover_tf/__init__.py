"""crossover_tf: two data-parallel Keras jobs (Horovod or TensorFlow collectives) time-share
accelerators, one computing while the other communicates (CrossoverScheduler, arXiv
2103.07974).

The runtime only: the strategy and its option groups, its train step and callbacks
(ProfileCallback writes the planner's profile of a job), and the device lease. The planner
(crossover_tf_planner) and the emulated-cluster harness (experiments/cluster) live apart.
"""
from crossover_tf._lazy import lazy_exports

__version__ = "0.1.0"

# Imported on first use (crossover_tf/_lazy.py): the TensorFlow-free parts (the lease's
# segments, its node exporter) must import without TensorFlow or Horovod.
_EXPORTS = {
    "CommunicationOptions": "crossover_tf.options", "DeviceOptions": "crossover_tf.options",
    "LeaseOptions": "crossover_tf.options", "LinkTurnOptions": "crossover_tf.options",
    "CrossoverStrategy": "crossover_tf.strategy", "DeviceLease": "crossover_tf.lease",
    "LeaseStats": "crossover_tf.lease", "ProfileCallback": "crossover_tf.profiling",
    "LeaseTensorBoard": "crossover_tf.profiling",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
__all__ = sorted(_EXPORTS)
