"""Priority mode at the lease level: a primary's steps alone and beside a secondary that
computes in micro-batches, for several micro-batch sizes, measured side by side in one run.

  python -m benchmarks.lease_priority [--seconds=4]

The primary's step (ops/lease_cli.cc, mode priority): compute 4 ms, allreduce 8 ms (device
free), apply 1 ms, 1 ms to the next step. Goal: primary_ratio >= 0.95 and max wait about one
micro-batch.
"""
from __future__ import annotations

import pathlib
import subprocess
import uuid

from absl import app, flags

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent

flags.DEFINE_float("seconds", 4.0, "Seconds per phase (primary alone, then paired).")
flags.DEFINE_list("micro_us", ["1000", "2000", "4000"], "Secondary micro-batch hold times.")
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    del argv
    cli = REPO_ROOT / "ops" / "build" / "lease_cli"
    subprocess.run(["make", "-s", "-C", str(REPO_ROOT / "ops"), "tests"], check=True)
    print("| micro-batch (ms) | primary steps alone | paired | primary ratio | "
          "max primary wait (ms) | secondary device share | overlaps |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for micro in FLAGS.micro_us:
        out = subprocess.run([str(cli), "priority", f"bp{uuid.uuid4().hex[:8]}",
                              str(FLAGS.seconds), micro], capture_output=True, text=True,
                             check=True, timeout=10 * FLAGS.seconds + 60).stdout
        r = dict(kv.split("=", 1) for kv in out.strip().splitlines()[-1].split())
        print(f"| {int(micro) / 1e3:g} | {r['solo_steps']} | {r['paired_steps']} | "
              f"{r['primary_ratio']} | {int(r['max_wait_us']) / 1e3:.2f} | "
              f"{r['secondary_busy']} | {r['overlaps']} |")


if __name__ == "__main__":
    app.run(main)
