"""Node tooling: every lease on a node, seen from outside the jobs, read-only.

`observer` reads one lease without TensorFlow (through _lease_observer.so), `directory_reader`
bounds a scan of the lease directory, `status` prints who is on each lease, `exporter` (with
`exporter_metrics`, its metric names) serves them to Prometheus, and `cli` is
`python -m crossover_tf.lease status | exporter` (the command keeps the lease's name).
Why apart from crossover_tf.lease: that package is what a job links against (the op wrapper
and the segment files); this one is what an operator runs beside the jobs, and it never joins,
creates or repairs a lease.
"""
