"""Reading a comparison: throughput, intervals, report, sweep, attribution, predictions."""
