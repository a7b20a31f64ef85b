"""python -m experiments.probes --mode=calibrate|link_sharing|contention (measure.py)."""
from absl import app

from experiments.probes.measure import define_flags, main

define_flags()
app.run(main)
