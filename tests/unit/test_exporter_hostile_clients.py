"""The exporter's server against hostile clients (crossover_tf/node/web_config.py; issue 59,
items 8, 9 and 10): password checks one at a time and cached, a decoy hash of the users' cost,
whole-connection deadlines, a connection cap, an accept loop that backs off when out of files,
the open-file limit raised at start, client_allowed_sans, and the web config re-read when it
changes. Each server runs in this process on a loopback port with a trivial application; the
limits are made small by setting the module's constants before the server starts.

benchmarks/exporter_hostile_clients.py measures the same at full size (docs/measurements.md).
"""
from __future__ import annotations

import errno
import http.client
import os
import pathlib
import resource
import select
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from typing import Callable, Iterator

import pytest

from conftest import REPO_ROOT
from exporter_tls import (CLIENT_SANS, PASSWORD, USER, Pki, basic, bcrypt_hash, client_hello,
                          make_pki, tls_and_auth_config, write_web_config)

pytest.importorskip("yaml", reason="PyYAML (the exporter extra; scripts/install.sh)")
pytest.importorskip("bcrypt", reason="bcrypt (the exporter extra; scripts/install.sh)")

from crossover_tf.node import web_config  # noqa: E402
from crossover_tf.node.web_config import WebConfigError  # noqa: E402


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def hello(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"crossover_lease_members 2\n"]


@pytest.fixture
def serve(tmp_path) -> Iterator[Callable]:
    """serve(config or None) -> the server, on a free loopback port; closed at the end."""
    servers = []

    def start(config) -> web_config.WSGIServer:
        web = (web_config.load(write_web_config(tmp_path / "web-config.yml", config))
               if config is not None else None)
        server = web_config.start_server("127.0.0.1", 0, hello, web)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def get(port: int, context: ssl.SSLContext | None = None, auth: str | None = None) -> int:
    conn = (http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
            if context else http.client.HTTPConnection("127.0.0.1", port, timeout=10))
    try:
        conn.request("GET", "/metrics", headers={"Authorization": auth} if auth else {})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> float | None:
    """Seconds until the server closes sock (None: still open after `seconds`), sending the
    next byte of `trickle` every 0.2 s meanwhile: a client slow enough for no read to time
    out."""
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < seconds:
        if select.select([sock], [], [], 0.2)[0]:
            try:
                if sock.recv(65536) == b"":
                    return time.monotonic() - start
            except OSError:
                return time.monotonic() - start
        if sent < len(trickle):
            try:
                sent += sock.send(trickle[sent:sent + 1])
            except OSError:
                return time.monotonic() - start
    return None


# --- item 8: password checks ----------------------------------------------------------------

@pytest.fixture
def bcrypt_calls(monkeypatch) -> dict:
    """Counts web_config's bcrypt checks, in order, and the most that ran at once (each made
    50 ms longer, so that concurrent ones overlap)."""
    seen = {"calls": 0, "running": 0, "most": 0, "hashes": [], "passwords": []}
    lock = threading.Lock()
    real = web_config._bcrypt_check

    def check(password: bytes, hashed: bytes) -> bool:
        with lock:
            seen["calls"] += 1
            seen["running"] += 1
            seen["most"] = max(seen["most"], seen["running"])
            seen["hashes"].append(hashed)
            seen["passwords"].append(password)
        try:
            time.sleep(0.05)
            return real(password, hashed)
        finally:
            with lock:
                seen["running"] -= 1

    monkeypatch.setattr(web_config, "_bcrypt_check", check)
    return seen


def at_once(check: Callable[[str], bool], headers: list[str]) -> list[bool]:
    """check(header) for each header, each in a thread of its own, all at once."""
    results: list[bool] = [False] * len(headers)
    start = threading.Barrier(len(headers))

    def run(i: int) -> None:
        start.wait(timeout=10)
        results[i] = check(headers[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(headers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


def users_config(tmp_path: pathlib.Path, users: dict[str, str]) -> web_config.WebConfig:
    return web_config.load(write_web_config(tmp_path / "web-config.yml",
                                            {"basic_auth_users": users}))


def test_a_wrong_password_runs_bcrypt_once_however_often_it_is_tried(tmp_path, bcrypt_calls):
    """Before: every failed check ran bcrypt, in parallel, never cached: 16 wrong passwords at
    once took 1.63 cores for 2.7 s. Now a failure is cached as a success is (exporter-toolkit
    does both): one bcrypt per distinct credential, however many requests carry it."""
    config = users_config(tmp_path, {USER: bcrypt_hash()})
    wrong = basic(USER, "guess")
    assert at_once(config.check_basic_auth, [wrong] * 16) == [False] * 16
    assert not config.check_basic_auth(wrong)
    assert bcrypt_calls["calls"] == 1, bcrypt_calls["calls"]
    assert config.check_basic_auth(basic(USER, PASSWORD))
    assert config.check_basic_auth(basic(USER, PASSWORD))
    assert bcrypt_calls["calls"] == 2, bcrypt_calls["calls"]
    assert not config.check_basic_auth(basic("nobody", "guess"))
    assert not config.check_basic_auth(basic("nobody", "guess"))
    assert bcrypt_calls["calls"] == 3, bcrypt_calls["calls"]


def test_password_checks_run_one_at_a_time(tmp_path, bcrypt_calls):
    """Distinct wrong passwords each cost a bcrypt, but one after another: a flood of guesses
    takes one core, not all of them (exporter-toolkit serialises them too)."""
    config = users_config(tmp_path, {USER: bcrypt_hash()})
    headers = [basic(USER, f"guess{i}") for i in range(8)]
    assert at_once(config.check_basic_auth, headers) == [False] * 8
    assert bcrypt_calls["calls"] == 8 and bcrypt_calls["most"] == 1, bcrypt_calls


def test_password_checks_take_turns_in_the_order_they_came(tmp_path, bcrypt_calls):
    """First come, first served: behind a queue of guesses the right password waits for those
    ahead of it only, never past its connection's deadline for losing the race again and
    again (a plain lock's waiters do; seen in benchmarks/exporter_hostile_clients.py)."""
    config = users_config(tmp_path, {USER: bcrypt_hash()})
    threads = [threading.Thread(target=config.check_basic_auth,
                                args=(basic(USER, f"guess{i}"), lambda: False))
               for i in range(8)]
    for thread in threads:
        thread.start()
        time.sleep(0.01)  # each behind the last, all while the first one's bcrypt runs
    for thread in threads:
        thread.join(timeout=30)
    assert bcrypt_calls["most"] == 1, bcrypt_calls
    order = [int(password.decode().removeprefix("guess"))
             for password in bcrypt_calls["passwords"]]
    assert order == list(range(8)), order


def test_the_cache_is_bounded_and_guesses_never_evict_the_right_password(tmp_path, monkeypatch,
                                                                        bcrypt_calls):
    monkeypatch.setattr(web_config, "AUTH_CACHE_SIZE", 8)
    config = users_config(tmp_path, {USER: bcrypt_hash()})
    assert config.check_basic_auth(basic(USER, PASSWORD))
    for i in range(3 * web_config.AUTH_CACHE_SIZE):
        assert not config.check_basic_auth(basic(USER, f"guess{i}"))
    assert len(config._cache) <= 2 * web_config.AUTH_CACHE_SIZE
    calls = bcrypt_calls["calls"]
    assert config.check_basic_auth(basic(USER, PASSWORD))
    assert bcrypt_calls["calls"] == calls  # still cached


def test_an_unknown_user_costs_a_decoy_of_the_users_cost(tmp_path, bcrypt_calls):
    """Before: an unknown user name was checked against the first user's hash, so the time of
    a 401 followed that user's cost. Now against a decoy hash of the users' (highest) cost,
    made at load: an unknown name costs what a known one does."""
    users = {USER: bcrypt_hash(cost=5), "other": bcrypt_hash(cost=4)}
    config = users_config(tmp_path, users)
    assert not config.check_basic_auth(basic("nobody", PASSWORD))
    (decoy,) = bcrypt_calls["hashes"]
    assert decoy.decode() not in users.values()
    assert decoy.decode().startswith("$2b$05$"), decoy


# --- item 9: slow clients ---------------------------------------------------------------------

@pytest.mark.parametrize("tls", [False, True])
def test_a_slow_client_is_cut_at_the_connection_deadline(serve, pki, monkeypatch, tls):
    """Before: the 30 s bound was per read, so a client that sent a byte now and then held its
    thread (and a file) for ever: a TLS handshake, or a request's headers. Now a whole
    handshake and a whole connection each have a deadline (here 1 s and 2 s)."""
    monkeypatch.setattr(web_config, "HANDSHAKE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(web_config, "CONNECTION_DEADLINE_S", 2.0, raising=False)
    server = serve(tls_and_auth_config(pki) if tls else None)
    trickle = client_hello() if tls else b"GET /metrics HTTP/1.1\r\n" + b"X-Slow: a\r\n" * 100
    with socket.create_connection(server.server_address) as slow:
        took = closed_within(slow, 6.0, trickle)
    assert took is not None and took < (1.0 if tls else 2.0) + 1.5, took


def test_beyond_the_cap_the_oldest_connection_is_closed_and_a_scrape_answered(serve,
                                                                             monkeypatch):
    """Before: no cap, a thread and a file per connection until the process ran out of files.
    Now at most MAX_CONNECTIONS at once: a new one closes the oldest, so idle or slow clients
    cannot keep a scrape out (here a cap of 4)."""
    monkeypatch.setattr(web_config, "MAX_CONNECTIONS", 4, raising=False)
    server = serve(None)
    idle = [socket.create_connection(server.server_address) for _ in range(12)]
    try:
        start = time.monotonic()
        assert get(server.server_address[1]) == 200
        assert time.monotonic() - start < 2
        closed = [closed_within(sock, 0.5) is not None for sock in idle]
    finally:
        for sock in idle:
            sock.close()
    assert closed[:9] == [True] * 9, closed  # the newest three may stay, beside the scrape


def test_the_accept_loop_backs_off_when_out_of_files(serve):
    """Before: when accept() failed for want of files (EMFILE) the loop tried again at once,
    spinning a core while the connection stayed in the backlog. Now it waits, 5 ms doubling to
    1 s, as Go's servers do."""
    server = serve(None)
    real = server.socket
    calls = []

    class OutOfFiles:
        def __getattr__(self, name):
            return getattr(real, name)

        def accept(self):
            calls.append(time.monotonic())
            raise OSError(errno.EMFILE, "Too many open files")

    server.socket = OutOfFiles()
    try:
        with socket.create_connection(server.server_address):
            time.sleep(1.0)
    finally:
        server.socket = real
    assert 1 <= len(calls) <= 20, len(calls)


def test_start_raises_the_soft_open_file_limit_to_the_hard_one(tmp_path):
    """Before: the exporter kept the soft limit it was started with (1,024 under systemd) and
    ran out of files beside ~1,000 slow clients. Now it raises it to the hard limit, as Go's
    runtime does for node_exporter."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 64:
        pytest.skip(f"the hard limit is {hard}: nothing to raise")
    code = ("import resource\nfrom crossover_tf.node import web_config\n"
            "web_config.start_server('127.0.0.1', 0, lambda e, s: [])\n"
            "print(*resource.getrlimit(resource.RLIMIT_NOFILE))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=REPO_ROOT,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                               (64, hard)))
    assert out.returncode == 0, out.stderr
    new_soft, new_hard = map(int, out.stdout.split())
    assert new_hard == hard and new_soft == (hard if hard != resource.RLIM_INFINITY
                                             else new_soft) and new_soft > 64, out.stdout


# --- item 10: client_allowed_sans and reloading ----------------------------------------------

def client_context(pki: Pki) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    return context


def sans_config(pki: Pki, sans: list[str], auth: str = "RequireAndVerifyClientCert") -> dict:
    return {"tls_server_config": {"cert_file": str(pki.server_cert),
                                  "key_file": str(pki.server_key), "client_auth_type": auth,
                                  "client_ca_file": str(pki.ca_cert),
                                  "client_allowed_sans": sans}}


@pytest.mark.parametrize("san", CLIENT_SANS)
def test_client_allowed_sans_admits_a_certificate_with_one_of_them(serve, pki, san):
    server = serve(sans_config(pki, ["someone.else", san]))
    assert get(server.server_address[1], client_context(pki)) == 200


def test_client_allowed_sans_refuses_a_certificate_without_them(serve, pki):
    server = serve(sans_config(pki, ["someone.else", "127.0.0.2"]))
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        get(server.server_address[1], client_context(pki))


def test_client_allowed_sans_needs_required_client_certificates(tmp_path, pki):
    path = write_web_config(tmp_path / "web-config.yml",
                            sans_config(pki, ["prometheus.test"], "VerifyClientCertIfGiven"))
    with pytest.raises(WebConfigError, match="client_allowed_sans.*RequireAndVerifyClientCert"):
        web_config.load(path)


def rewrite(path: pathlib.Path, config: dict) -> None:
    """Writes the file anew with a later modification time (a coarse clock cannot hide it)."""
    write_web_config(path, config)
    later = time.time_ns() + 2_000_000_000
    os.utime(path, ns=(later, later))


def test_the_web_config_is_reread_when_it_changes(serve, tmp_path, monkeypatch, capfd):
    """Before: the file was read once, at start; a new password needed a restart. Now it is
    re-read when it (or a file it names) changes, as exporter-toolkit reads it per request; a
    file that does not load, or that would serve less protected, is refused and the old one
    kept, with a line that says why."""
    monkeypatch.setattr(web_config, "RELOAD_CHECK_S", 0.0, raising=False)
    server = serve({"basic_auth_users": {USER: bcrypt_hash()}})
    port, path = server.server_address[1], tmp_path / "web-config.yml"
    assert get(port, auth=basic(USER, PASSWORD)) == 200
    rewrite(path, {"basic_auth_users": {USER: bcrypt_hash("new password")}})
    assert get(port, auth=basic(USER, "new password")) == 200
    assert get(port, auth=basic(USER, PASSWORD)) == 401
    rewrite(path, {"basic_auth_users": {USER: "not a hash"}})
    assert get(port, auth=basic(USER, "new password")) == 200
    rewrite(path, {})  # no users: less protected than at start
    assert get(port, auth=basic(USER, "new password")) == 200
    assert get(port) == 401
    err = capfd.readouterr().err
    assert "not a bcrypt hash" in err and "kept" in err, err
    assert "less protected" in err, err


def test_sighup_rereads_the_web_config(serve, tmp_path, monkeypatch):
    """The exporter re-reads its web config on SIGHUP too, whether or not the file's time
    changed (a file replaced within the clock's resolution)."""
    from crossover_tf.node import exporter
    monkeypatch.setattr(web_config, "RELOAD_CHECK_S", 3600.0, raising=False)
    server = serve({"basic_auth_users": {USER: bcrypt_hash()}})
    port = server.server_address[1]
    assert get(port, auth=basic(USER, PASSWORD)) == 200
    write_web_config(tmp_path / "web-config.yml",
                     {"basic_auth_users": {USER: bcrypt_hash("new password")}})
    previous = signal.signal(signal.SIGHUP, lambda signum, frame: None)  # never the default
    try:
        exporter.reload_on_sighup(server)
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.1)
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert get(port, auth=basic(USER, "new password")) == 200
