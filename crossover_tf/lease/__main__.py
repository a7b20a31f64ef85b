"""`python -m crossover_tf.lease status [--lease_dir DIR] [--group G]` (see status.py)."""
import sys

from crossover_tf.lease.status import main

sys.exit(main())
