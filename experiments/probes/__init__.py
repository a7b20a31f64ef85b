"""Measurements on the emulated cluster the planner charges: comm CPU, link sharing and
contention (python -m experiments.probes --mode=...)."""
