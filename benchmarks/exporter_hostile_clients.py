"""The exporter's server (crossover_tf/node/web_config.py) under hostile clients, on loopback
(issue 59, items 8 and 9): the CPU it spends on wrong passwords, and how long a correct scrape
takes beside many slow clients.

  python -m benchmarks.exporter_hostile_clients --case wrong_passwords [--tries 100] [--cost 12]
  python -m benchmarks.exporter_hostile_clients --case slow_clients [--slow 1000] [--seconds 20]
  ... [--web_config_module PATH]   # another web_config.py, e.g. `git show HEAD:...` of it

The server runs in a process of its own (this module with --serve), built from the module at
--web_config_module (the package's by default, so an older copy can be measured the same way):
its start_server() serves prometheus_client's default registry behind TLS and basic auth (one
user, a bcrypt hash of cost --cost), with the soft RLIMIT_NOFILE a systemd service starts with
(1,024).

wrong_passwords: --tries requests, 16 at a time, with a wrong password: first the same one each
time (a misconfigured Prometheus, an attacker repeating a guess), then a different one each
time; the server's CPU seconds (utime + stime from /proc) and wall time for each.

slow_clients: --slow clients each connect, complete the TLS handshake, then send a request's
headers one byte a round (one round a second: no read of the server's ever times out), and
connect again when the server closes them; meanwhile a correct scrape (the CA, the password)
every second, each given 10 s: how many are answered, and how fast. The server's CPU over the
phase shows an accept loop that spins. The slow clients run in a process of their own, so that
the scrapes share no interpreter lock with them. Bounded: --seconds of scrapes after 5 rounds
to get the clients in, every slow client's socket non-blocking.
"""
from __future__ import annotations

import argparse
import base64
import concurrent.futures
import http.client
import importlib.util
import os
import pathlib
import resource
import select
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Sequence

from benchmarks.common import parse_args

REPO = pathlib.Path(__file__).resolve().parent.parent
WEB_CONFIG = REPO / "crossover_tf" / "node" / "web_config.py"
SYSTEMD_SOFT_NOFILE = 1024
USER, PASSWORD = "prometheus", "the right password"
SCRAPE_TIMEOUT_S = 10.0  # Prometheus's default scrape timeout
WRONG_PASSWORD_TIMEOUT_S = 300.0  # every wrong password answered: its CPU all counted
SLOW_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: 1\r\n" * 1000
SHORT = {"tries": 10, "cost": 4, "slow": 50, "seconds": 2.0}


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=("wrong_passwords", "slow_clients"),
                        default="wrong_passwords")
    parser.add_argument("--tries", type=int, default=100, help="wrong-password requests")
    parser.add_argument("--cost", type=int, default=12, help="bcrypt cost of the user's hash")
    parser.add_argument("--slow", type=int, default=1000, help="slow clients")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="seconds of scrapes beside the slow clients")
    parser.add_argument("--web_config_module", type=pathlib.Path, default=WEB_CONFIG)
    parser.add_argument("--serve", type=pathlib.Path, help=argparse.SUPPRESS)
    parser.add_argument("--attack", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cafile", type=pathlib.Path, help=argparse.SUPPRESS)
    return parse_args(parser, SHORT, argv)


# --- the server -----------------------------------------------------------------------------

def serve(module_path: pathlib.Path, config: pathlib.Path) -> None:
    """The server process: start_server() of the module at module_path, its port on stdout,
    then sleep until killed (at most an hour)."""
    spec = importlib.util.spec_from_file_location("web_config_under_test", module_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    from prometheus_client import REGISTRY, make_wsgi_app
    server = module.start_server("127.0.0.1", 0, make_wsgi_app(REGISTRY), module.load(config))
    print(server.server_address[1], flush=True)
    time.sleep(3600)


def _systemd_limits() -> None:
    """In the server process before it starts: the soft open-file limit of a systemd service."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(SYSTEMD_SOFT_NOFILE, hard), hard))


class Server:
    """The server process, with TLS and one user, in a scratch directory of its own."""

    def __init__(self, module: pathlib.Path, cost: int, scratch: pathlib.Path) -> None:
        import bcrypt
        cert, key = scratch / "server.crt", scratch / "server.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                        "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(key), "-out", str(cert)],
                       check=True, capture_output=True, timeout=60)
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=cost)).decode()
        config = scratch / "web-config.yml"
        config.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
                          f"basic_auth_users:\n  {USER}: {hashed}\n")
        self.cafile = cert
        self.context = ssl.create_default_context(cafile=str(cert))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.exporter_hostile_clients", "--serve",
             str(config), "--web_config_module", str(module)],
            stdout=subprocess.PIPE, text=True, cwd=REPO, preexec_fn=_systemd_limits)
        self.port = int(self.proc.stdout.readline())

    def cpu_s(self) -> float:
        """The server process's CPU seconds so far (user + system)."""
        fields = pathlib.Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1]
        utime, stime = fields.split()[11:13]
        return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")

    def scrape(self, password: str = PASSWORD, timeout: float = SCRAPE_TIMEOUT_S) -> int:
        """One HTTPS GET /metrics with basic auth: its status (0: no answer in time)."""
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context,
                                           timeout=timeout)
        auth = base64.b64encode(f"{USER}:{password}".encode()).decode()
        try:
            conn.request("GET", "/metrics", headers={"Authorization": f"Basic {auth}"})
            response = conn.getresponse()
            response.read()
            return response.status
        except (OSError, http.client.HTTPException):
            return 0
        finally:
            conn.close()

    def close(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


# --- wrong passwords ------------------------------------------------------------------------

def wrong_passwords(server: Server, passwords: list[str]) -> tuple[float, float, list[int]]:
    """(server CPU seconds, wall seconds, statuses) of one request per password, 16 at once,
    each awaited until answered."""
    cpu, start = server.cpu_s(), time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(lambda password: server.scrape(password,
                                                                WRONG_PASSWORD_TIMEOUT_S),
                                 passwords))
    return server.cpu_s() - cpu, time.monotonic() - start, statuses


def measure_wrong_passwords(server: Server, tries: int) -> list[str]:
    lines = []
    distinct = [f"guess{i}" for i in range(tries)]
    for name, passwords in (("the same wrong password", ["guess"] * tries),
                            ("a different wrong password each", distinct)):
        cpu, wall, statuses = wrong_passwords(server, passwords)
        refused = sum(status == 401 for status in statuses)
        lines.append(f"result: {tries} tries of {name}: server CPU {cpu:.2f} s over {wall:.2f} s "
                     f"({cpu / wall:.2f} cores), {refused} answered 401")
    return lines


# --- slow clients ---------------------------------------------------------------------------

def _ready(file: object, events: int, timeout_s: float = 0.0) -> bool:
    """Whether file (a socket, stdin) has one of `events` (poll, not select: more than 1,024
    files are open)."""
    poller = select.poll()
    poller.register(file, events)
    return bool(poller.poll(timeout_s * 1e3))


class SlowClient:
    """A client that connects, completes the TLS handshake, then sends a request's headers one
    byte per step(), never ending them: each read the server makes returns within a second.
    `gone` once the server closed it."""

    def __init__(self, port: int, context: ssl.SSLContext) -> None:
        self.context = context
        self.sock: socket.socket = socket.socket()
        self.sock.setblocking(False)
        self.sock.connect_ex(("127.0.0.1", port))  # EINPROGRESS; a full backlog: pending
        self.stage, self.sent, self.gone = "connecting", 0, False

    def step(self) -> None:
        try:
            if self.stage == "connecting":
                self._connected()
            elif self.stage == "handshaking":
                self.sock.do_handshake()
                self.stage = "trickling"
            else:
                self._trickle()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            pass
        except OSError:  # ssl.SSLError too: reset, closed, refused
            self.gone = True

    def _connected(self) -> None:
        if not _ready(self.sock, select.POLLOUT):
            return
        error = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error:
            raise OSError(error, os.strerror(error))
        self.sock = self.context.wrap_socket(self.sock, server_hostname="127.0.0.1",
                                             do_handshake_on_connect=False)
        self.stage = "handshaking"
        self.sock.do_handshake()
        self.stage = "trickling"

    def _trickle(self) -> None:
        if _ready(self.sock, select.POLLIN) and self.sock.recv(4096) == b"":
            raise ConnectionResetError("closed by the server")
        if self.sent < len(SLOW_REQUEST):
            self.sent += self.sock.send(SLOW_REQUEST[self.sent:self.sent + 1])


class SlowClients:
    """count SlowClients, each replaced by a new one when the server closes it."""

    def __init__(self, port: int, count: int, context: ssl.SSLContext) -> None:
        self.port, self.context = port, context
        self.clients = [SlowClient(port, context) for _ in range(count)]
        self.reconnects = 0

    def step(self) -> None:
        """One step of each client; a client the server closed connects again."""
        for i, client in enumerate(self.clients):
            if client.gone:
                client.sock.close()
                self.clients[i] = SlowClient(self.port, self.context)
                self.reconnects += 1
            else:
                client.step()

    def sending(self) -> int:
        """How many are past their handshake, sending their headers."""
        return sum(client.stage == "trickling" and not client.gone for client in self.clients)

    def close(self) -> None:
        for client in self.clients:
            client.sock.close()


def raise_own_file_limit() -> None:
    """This process holds --slow sockets at once."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def attack(port: int, cafile: pathlib.Path, slow: int, seconds: float) -> None:
    """The slow clients' process (apart, so that the scrapes share no interpreter lock with
    them): 5 rounds to get them in, a line saying how many send headers, then a round a second
    until stdin closes (at most `seconds` + 60 s), and a line with the reconnections."""
    raise_own_file_limit()
    clients = SlowClients(port, slow, ssl.create_default_context(cafile=str(cafile)))
    for _ in range(5):  # connected, handshaken, sending (the backlog drains as it accepts)
        clients.step()
        time.sleep(1.0)
    print(clients.sending(), flush=True)
    start = time.monotonic()
    while not _ready(sys.stdin, select.POLLIN | select.POLLHUP, 1.0):
        clients.step()
        if time.monotonic() - start > seconds + 60:
            break
    clients.close()
    print(clients.reconnects, flush=True)


def measure_slow_clients(server: Server, slow: int, seconds: float) -> list[str]:
    attacker = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.exporter_hostile_clients", "--attack",
         str(server.port), "--cafile", str(server.cafile), "--slow", str(slow), "--seconds",
         str(seconds)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        sending = int(attacker.stdout.readline())
        cpu, start = server.cpu_s(), time.monotonic()
        latencies, statuses = [], []
        while time.monotonic() - start < seconds:
            began = time.monotonic()
            statuses.append(server.scrape())
            latencies.append(time.monotonic() - began)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - began)))
        cores = (server.cpu_s() - cpu) / (time.monotonic() - start)
        attacker.stdin.close()
        reconnects = int(attacker.stdout.readline())
    finally:
        attacker.kill()
        attacker.wait(timeout=30)
    answered = [t for t, status in zip(latencies, statuses) if status == 200]
    timing = (f"median {statistics.median(answered) * 1e3:.0f} ms, max "
              f"{max(answered) * 1e3:.0f} ms" if answered else "none answered")
    return [f"result: {len(answered)} of {len(statuses)} correct scrapes answered beside {slow} "
            f"slow clients, {sending} of them sending headers at the start ({timing}; each "
            f"given {SCRAPE_TIMEOUT_S:.0f} s); server CPU {cores:.2f} cores; the server closed "
            f"slow clients {reconnects} times"]


def main(argv: Sequence[str] | None = None) -> None:
    args = arguments(argv)
    if args.serve is not None:
        serve(args.web_config_module, args.serve)
        return
    if args.attack is not None:
        attack(args.attack, args.cafile, args.slow, args.seconds)
        return
    with tempfile.TemporaryDirectory(prefix="exporter-hostile-") as scratch:
        server = Server(args.web_config_module.resolve(), args.cost, pathlib.Path(scratch))
        try:
            print(f"server: {args.web_config_module}, bcrypt cost {args.cost}, soft "
                  f"RLIMIT_NOFILE {SYSTEMD_SOFT_NOFILE} at start", flush=True)
            lines = (measure_wrong_passwords(server, args.tries)
                     if args.case == "wrong_passwords"
                     else measure_slow_clients(server, args.slow, args.seconds))
        finally:
            server.close()
    for line in lines:
        print(line, flush=True)


if __name__ == "__main__":
    main()
