"""`python -m crossover_tf.lease status | exporter [--lease_dir DIR] [--group G]` (cli.py)."""
import sys

from crossover_tf.lease.cli import main

sys.exit(main())
