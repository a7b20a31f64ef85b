"""Custom TensorFlow ops of crossover_tf (built from ../../ops, loaded lazily)."""
