"""How the runtime moves bytes between ranks, behind one seam.

Private, as Horovod's `_keras` is: `communicator.Communicator` is the interface the step code
calls; each backend is one module beside it (`horovod.py`, `tensorflow.py`), imported only when
chosen (communicator_for), so that Horovod stays optional.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from absl import logging

if TYPE_CHECKING:
    from crossover_tf._communication.communicator import Communicator
    from crossover_tf.options import CommunicationOptions


def chosen_backend(communication: "CommunicationOptions",
                   env: Mapping[str, str] | None = None) -> str:
    """The backend this process uses; what "auto" picked, and why, is logged (once: the
    strategy asks once, at start)."""
    from crossover_tf.options import resolve_backend
    backend, why = resolve_backend(communication.backend, env)
    if communication.backend == "auto":
        logging.info("crossover_tf: backend 'auto' picked %s (%s)", backend, why)
    return backend


def communicator_for(communication: "CommunicationOptions") -> "Communicator":
    """The job's communicator, from the backend chosen (communicator.py says what each
    provides). Each backend's library is imported only when chosen: Horovod is optional."""
    if chosen_backend(communication) == "tensorflow":
        from crossover_tf._communication.tensorflow import TensorFlowCommunicator
        return TensorFlowCommunicator(communication.cluster_resolver,
                                      communication.collective_timeout_s)
    try:
        from crossover_tf._communication.horovod import HorovodCommunicator
    except ImportError as err:
        raise ImportError(
            f"crossover_tf: the horovod backend needs Horovod 0.28.1 ({err}); install it with "
            "`pip install 'crossover_tf[horovod]'` (a patched source build: bash "
            "scripts/install.sh), or use CommunicationOptions(backend='tensorflow')") from None
    return HorovodCommunicator(communication.compression, communication.init_horovod)
