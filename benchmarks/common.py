"""What the benchmarks share: a `--short` mode and the run-to-run spread they print.

Why `--short`: a benchmark no test runs rots silently (issue 38: strategy_overhead failed
unseen). Each benchmark takes `--short` to run in seconds with the same code path, so
tests/system/test_benchmarks.py can run the documented command and check that it prints its figure;
the figures themselves come only from the full runs.
"""
from __future__ import annotations

import argparse
from typing import Any, Mapping, Sequence

from experiments.analysis.report import with_spread
from experiments.comparison.trials import spread


def parse_args(parser: argparse.ArgumentParser, short: Mapping[str, Any],
               argv: Sequence[str] | None = None) -> argparse.Namespace:
    """parser's arguments, with `--short` added: it swaps the defaults for `short` (flags given
    explicitly still win), so a short run differs from a full one only in its sizes."""
    parser.add_argument("--short", action="store_true",
                        help="seconds, not minutes, to check that the benchmark runs (no figures): "
                        + ", ".join(f"--{k}={v}" for k, v in short.items()))
    args = parser.parse_args(argv)
    if args.short:
        parser.set_defaults(**short)
        args = parser.parse_args(argv)
    return args


def median_range(values: Sequence[float], digits: int = 2) -> str:
    """"median [min–max]" of several runs' values: one run on a shared machine says little, the
    spread says how far its figure can be trusted."""
    return with_spread(spread(list(values)), digits)
