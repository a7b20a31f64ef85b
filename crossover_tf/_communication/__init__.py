"""How the runtime moves bytes between ranks, behind one seam.

Private, as Horovod's `_keras` is: `communicator.Communicator` is the interface the step code
calls; each backend is one module beside it (`horovod.py`).
"""
