"""`python -m crossover_tf.lease status | exporter`: an operator's view of a node's leases.

The command keeps the lease package's name (recipes, images and alert texts use it); its code
is here, with the rest of the node's tooling.

`status` prints who is on each lease once (status.py); `exporter` serves it to Prometheus
(exporter.py), on loopback unless --web.config.file protects it with TLS and basic auth
(web_config.py) or --insecure says to serve it unprotected. Each command imports only what it
needs: the exporter never imports TensorFlow.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from crossover_tf.lease.segments import LEASE_DIR_ENV
from crossover_tf.node.web_config import WebConfig, is_loopback, load as load_web_config

EXPORTER_PORT = 9469  # exporter.DEFAULT_PORT, without importing prometheus_client here
# Loopback unless protected or told otherwise: the metrics name the jobs, pids and devices of
# every lease on the node (docs/exporter.md, "Who may read the metrics").
EXPORTER_ADDRESS = "127.0.0.1"


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m crossover_tf.lease",
                                  description="Inspect device leases (read-only).")
    commands = top.add_subparsers(dest="command", required=True)
    show = commands.add_parser("status", help="members, holder and queue of each lease")
    export = commands.add_parser("exporter", help="serve the leases' metrics to Prometheus")
    for command in (show, export):
        command.add_argument("--lease.dir", "--lease_dir", dest="lease_dir", default=None,
                             help=f"lease directory (default: ${LEASE_DIR_ENV}, else /dev/shm)")
        command.add_argument("--group", default=None, help="only this group's leases")
    export.add_argument("--web.listen-address", dest="web_listen_address", default=None,
                        metavar="HOST:PORT",
                        help=f"where to serve /metrics, as Prometheus exporters take it "
                             f"(default {EXPORTER_ADDRESS}:{EXPORTER_PORT}: this node only; "
                             f"':PORT' is every interface, '[::1]:PORT' IPv6). Beyond loopback "
                             "it needs --web.config.file with TLS and basic auth (or client "
                             "certificates), or --insecure. Overrides --address and --port")
    export.add_argument("--port", type=int, default=EXPORTER_PORT,
                        help=f"the older spelling: port to serve /metrics on (default "
                             f"{EXPORTER_PORT})")
    export.add_argument("--address", default=EXPORTER_ADDRESS,
                        help=f"the older spelling: address to listen on (default "
                             f"{EXPORTER_ADDRESS})")
    export.add_argument("--web.config.file", dest="web_config_file", default=None,
                        metavar="FILE",
                        help="TLS and basic auth, in the Prometheus exporters' web "
                             "configuration format (tls_server_config, basic_auth_users; "
                             "docs/exporter.md)")
    export.add_argument("--insecure", action="store_true",
                        help="serve beyond loopback without TLS or authentication: anyone who "
                             "reaches the address reads every lease's jobs, pids and devices")
    return top


def listen_on(args: argparse.Namespace) -> tuple[str, int]:
    """The exporter's (address, port): --web.listen-address HOST:PORT where given, else the
    older --address and --port."""
    if args.web_listen_address is None:
        return args.address, args.port
    host, colon, port = args.web_listen_address.rpartition(":")
    if not colon or not port.isdigit():
        raise ValueError(f"--web.listen-address must be HOST:PORT (e.g. {EXPORTER_ADDRESS}:"
                         f"{EXPORTER_PORT}, or :{EXPORTER_PORT} for every interface), got "
                         f"{args.web_listen_address!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


def check_exposure(address: str, web: WebConfig | None, insecure: bool) -> str | None:
    """Refuses (ValueError) to serve the metrics unprotected beyond loopback; returns a warning
    to print where --insecure allows it, else None."""
    if (web is not None and web.protects) or is_loopback(address):
        return None
    shown = repr(address) if address in ("", "::") else address
    exposed = (f"the listen address {shown} is reachable from other hosts, and the metrics name "
               "every lease's jobs, pids, pid namespaces and devices")
    if web is None:
        missing = "without --web.config.file"
    elif web.tls is None:
        missing = (f"{web.path} has no tls_server_config: passwords and metrics would cross "
                   "the network in the clear")
    else:
        missing = (f"{web.path} has neither basic_auth_users nor client_auth_type "
                   "RequireAndVerifyClientCert: anyone who reaches it may read them")
    if insecure:
        return f"warning: {exposed}; --insecure serves them {missing}"
    raise ValueError(f"{exposed}; refusing to serve them {missing}. Give --web.config.file "
                     "with TLS and basic auth (docs/exporter.md, \"Who may read the "
                     "metrics\"), or --insecure to serve them anyway")


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # Before TensorFlow or anything else could touch a device: reading a lease needs no GPU,
    # and must never take GPU memory from the jobs it watches.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        if args.command == "exporter":
            address, port = listen_on(args)
            if not 0 < port < 65536:
                given = "--web.listen-address" if args.web_listen_address else "--port"
                raise ValueError(f"{given} must be in 1-65535, got {port}")
            # Checked before anything is served: never a refusal at scrape time.
            web = load_web_config(args.web_config_file) if args.web_config_file else None
            warning = check_exposure(address, web, args.insecure)
            if warning:
                print(warning, file=sys.stderr, flush=True)
            try:
                from crossover_tf.node.exporter import serve  # no TensorFlow
            except ModuleNotFoundError as err:
                if err.name != "prometheus_client":
                    raise
                print("error: the exporter needs prometheus_client: pip install "
                      "'crossover_tf[exporter]' (or prometheus-client==0.26.0)", file=sys.stderr)
                return 2
            serve(port, address, args.lease_dir, args.group, web)
            return 0
        from crossover_tf.node.status import status  # imports TensorFlow
        text, code = status(args.lease_dir, args.group)
    except ValueError as err:  # LeaseDirError, a bad group name, port, address, web config
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the port is taken, the observer library is missing
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
