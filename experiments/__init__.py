"""Experiment drivers and their input pipelines."""
