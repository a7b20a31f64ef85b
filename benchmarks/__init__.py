"""Benchmarks: scripts that print ratios and latencies measured side by side in one run."""
