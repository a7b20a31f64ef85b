"""Emulated multi-host cluster for two Horovod jobs: namespaces, shaping, Gloo launch, cleanup.

`netns` builds the cluster, `launch` starts and supervises a job's ranks in it, `cleanup` removes
leftovers. Nothing here imports TensorFlow; `launch` imports horovod.runner for the horovod
backend only.
"""
from experiments.cluster.cleanup import cleanup_stale, remove_lease_segments
from experiments.cluster.netns import EmulatedCluster, Host

__all__ = ["EmulatedCluster", "Host", "cleanup_stale", "remove_lease_segments"]
