"""Example jobs installed with crossover_tf, so that an image with the package installed (and
no checkout) runs the deploy/ recipes as they are: `python -m crossover_tf.examples.<name>`.

They stand in for a user's own training script: put yours in the image and its command in the
recipe's place, with the same flags (or your own) for the group, its job count and the backend.
"""
