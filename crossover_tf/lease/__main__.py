"""`python -m crossover_tf.lease status | exporter [--lease_dir DIR] [--group G]`: the node's
tooling (crossover_tf/node/cli.py), under the command operators already run."""
import sys

from crossover_tf.node.cli import main

sys.exit(main())
