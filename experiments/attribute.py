"""Where a crossed step's time goes in a saved comparison (experiments/analysis/attribute.py).

  python -m experiments.attribute --dir=runs/compare    # writes attribution.{json,md}
"""
from absl import app

from experiments.analysis.attribute import define_flags, main, run

__all__ = ["define_flags", "main", "run"]

if __name__ == "__main__":
    define_flags()
    app.run(main)
