"""`python -m crossover_tf.lease status | exporter`: an operator's view of a node's leases.

The command keeps the lease package's name (recipes, images and alert texts use it); its code
is here, with the rest of the node's tooling.

`status` prints who is on each lease once (status.py); `exporter` serves it to Prometheus
(exporter.py). Each command imports only what it needs: the exporter never imports TensorFlow.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from crossover_tf.lease.segments import LEASE_DIR_ENV

EXPORTER_PORT = 9469  # exporter.DEFAULT_PORT, without importing prometheus_client here


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m crossover_tf.lease",
                                  description="Inspect device leases (read-only).")
    commands = top.add_subparsers(dest="command", required=True)
    show = commands.add_parser("status", help="members, holder and queue of each lease")
    export = commands.add_parser("exporter", help="serve the leases' metrics to Prometheus")
    for command in (show, export):
        command.add_argument("--lease_dir", default=None,
                             help=f"lease directory (default: ${LEASE_DIR_ENV}, else /dev/shm)")
        command.add_argument("--group", default=None, help="only this group's leases")
    export.add_argument("--port", type=int, default=EXPORTER_PORT,
                        help=f"port to serve /metrics on (default {EXPORTER_PORT})")
    export.add_argument("--address", default="0.0.0.0",
                        help="address to listen on (default 0.0.0.0: every interface)")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # Before TensorFlow or anything else could touch a device: reading a lease needs no GPU,
    # and must never take GPU memory from the jobs it watches.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        if args.command == "exporter":
            if not 0 < args.port < 65536:
                raise ValueError(f"--port must be in 1-65535, got {args.port}")
            try:
                from crossover_tf.node.exporter import serve  # no TensorFlow
            except ModuleNotFoundError as err:
                if err.name != "prometheus_client":
                    raise
                print("error: the exporter needs prometheus_client: pip install "
                      "'crossover_tf[exporter]' (or prometheus-client==0.26.0)", file=sys.stderr)
                return 2
            serve(args.port, args.address, args.lease_dir, args.group)
            return 0
        from crossover_tf.node.status import status  # imports TensorFlow
        text, code = status(args.lease_dir, args.group)
    except ValueError as err:  # LeaseDirError, a bad group name or port
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the port is taken, the observer library is missing
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
