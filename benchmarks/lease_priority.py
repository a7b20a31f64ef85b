"""Priority mode at the lease level: a primary's steps alone and beside a secondary that
computes in micro-batches, for several micro-batch sizes, measured side by side in one run.

  python -m benchmarks.lease_priority [--seconds=4] [--micro_us=1000,2000,4000]

The primary's step (ops/testing/lease_cli.cc, mode priority): compute 4 ms, allreduce 8 ms (device
free), apply 1 ms, 1 ms to the next step. Goal: primary_ratio >= 0.95 and max wait about one
micro-batch; overlaps (both holding the device at once) must be 0.
"""
from __future__ import annotations

import argparse
import pathlib
import subprocess
import uuid
from typing import Sequence

from benchmarks.common import parse_args

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
CLI = REPO_ROOT / "ops" / "build" / "lease_cli"
# A few seconds: every micro-batch size, each phase half a second.
SHORT = {"seconds": 0.5}


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0,
                        help="seconds per phase (primary alone, then paired)")
    parser.add_argument("--micro_us", type=lambda text: text.split(","),
                        default=["1000", "2000", "4000"],
                        help="the secondary's micro-batch hold times (us), comma-separated")
    return parse_args(parser, SHORT, argv)


def measure(seconds: float, micro_us: str) -> dict[str, str]:
    """One `lease_cli priority` run: its key=value result line."""
    out = subprocess.run([str(CLI), "priority", f"bp{uuid.uuid4().hex[:8]}", str(seconds),
                          micro_us], capture_output=True, text=True, check=True,
                         timeout=10 * seconds + 60).stdout
    return dict(kv.split("=", 1) for kv in out.strip().splitlines()[-1].split())


def main(argv: Sequence[str] | None = None) -> None:
    args = arguments(argv)
    subprocess.run(["make", "-s", "-C", str(REPO_ROOT / "ops"), "tests"], check=True)
    print("| micro-batch (ms) | primary steps alone | paired | primary ratio | "
          "max primary wait (ms) | secondary device share | overlaps |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for micro in args.micro_us:
        r = measure(args.seconds, micro)
        print(f"| {int(micro) / 1e3:g} | {r['solo_steps']} | {r['paired_steps']} | "
              f"{r['primary_ratio']} | {int(r['max_wait_us']) / 1e3:.2f} | "
              f"{r['secondary_busy']} | {r['overlaps']} |", flush=True)


if __name__ == "__main__":
    main()
