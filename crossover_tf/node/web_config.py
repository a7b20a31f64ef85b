"""The exporter's TLS and basic auth: `--web.config.file`, as the Prometheus exporters have it.

The file is the one the Prometheus exporters (node_exporter and the others built on
exporter-toolkit) take with the same flag, so that one file, one habit and one scrape config
serve them all (docs/exporter.md, "Who may read the metrics"):

    tls_server_config:
      cert_file: server.crt      # PEM; a relative path is relative to this file's directory
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional: NoClientCert (default),
      client_ca_file: ca.crt                         # VerifyClientCertIfGiven, or this one
      min_version: TLS12         # TLS10..TLS13, default TLS12; max_version likewise
    basic_auth_users:
      prometheus: $2b$12$...     # a bcrypt hash of the password, never the password

Everything is checked when the exporter starts, never at scrape time: an unknown key (a typo
would otherwise silently turn protection off), a toolkit key this exporter does not implement,
a missing or unreadable file, a key that does not match its certificate, a client-auth policy
without its CA (or a CA without a policy), a value that is not a bcrypt hash. Each refusal is
a WebConfigError (a ValueError: the command exits 2) that names the file and the key, never a
user's hash or password.

The server (start_server) is prometheus_client's WSGI application behind our own threading
WSGI server, not prometheus_client's start_http_server(certfile=...): that one does the TLS
handshake in its one accepting thread, so a client that connects and sends nothing stalls
every other scrape. Here the listening socket stays plain; each connection's thread peeks at
its first byte, answers plain HTTP with a 400 that says so (as Go's servers do), and does the
handshake itself, bounded by HANDSHAKE_TIMEOUT_S. Basic auth wraps the application: bcrypt as
the toolkit does (a user name that does not exist costs the same bcrypt as one that does), and
a small cache of passwords that checked out, keyed by their SHA-256, so that Prometheus's
scrapes do not each pay for a bcrypt; a wrong password is never cached.

This module needs neither prometheus_client nor TensorFlow: PyYAML reads the file and bcrypt
checks the passwords, both in the exporter extra (imported only when a file is given).
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import ipaddress
import os
import pathlib
import socket
import ssl
import sys
import threading
from socketserver import ThreadingMixIn
from typing import Any, Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

HANDSHAKE_TIMEOUT_S = 10.0   # a TLS client's first byte and handshake
REQUEST_TIMEOUT_S = 30.0     # each read of a request and write of its answer
AUTH_CACHE_SIZE = 64         # passwords that checked out, by SHA-256 of user and password
REALM = "crossover lease exporter"

TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# exporter-toolkit's client_auth_type values that Python's ssl can do, and how.
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
# ... and those it cannot: Python's ssl cannot ask for a certificate without verifying it.
UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
TOP_KEYS = ("tls_server_config", "basic_auth_users")
TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
            "max_version")
# exporter-toolkit keys not implemented here: refused by name rather than ignored.
UNSUPPORTED_KEYS = {"http_server_config", "cert", "key", "client_ca", "client_allowed_sans",
                    "cipher_suites", "curve_preferences", "prefer_server_cipher_suites"}

_PLAIN_HTTP_ANSWER = (b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                      b"Connection: close\r\n\r\n"
                      b"Client sent an HTTP request to an HTTPS server.\n")


class WebConfigError(ValueError):
    """The web configuration file cannot be used; the message names the file and the key."""


@dataclasses.dataclass(frozen=True)
class TLSConfig:
    cert_file: pathlib.Path
    key_file: pathlib.Path
    client_auth_type: str
    client_ca_file: pathlib.Path | None
    min_version: str
    max_version: str | None
    context: ssl.SSLContext = dataclasses.field(repr=False, compare=False)


@dataclasses.dataclass
class WebConfig:
    """A loaded --web.config.file: TLS (None: plain HTTP) and basic-auth users (name -> bcrypt
    hash; empty: no basic auth)."""
    path: pathlib.Path
    tls: TLSConfig | None
    users: dict[str, bytes]
    _ok: set[bytes] = dataclasses.field(default_factory=set, repr=False)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    @property
    def scheme(self) -> str:
        return "http" if self.tls is None else "https"

    @property
    def client_certificates_required(self) -> bool:
        return self.tls is not None and self.tls.client_auth_type == "RequireAndVerifyClientCert"

    @property
    def protects(self) -> bool:
        """TLS, and every client proves who it is (a password or a certificate): what serving
        beyond loopback needs (cli.py)."""
        return self.tls is not None and (bool(self.users) or self.client_certificates_required)

    def describe(self) -> str:
        parts = [f"TLS (min {self.tls.min_version}, client certificates: "
                 f"{self.tls.client_auth_type})" if self.tls else "no TLS"]
        parts.append(f"basic auth ({len(self.users)} user{'s' * (len(self.users) != 1)})"
                     if self.users else "no basic auth")
        return ", ".join(parts)

    def check_basic_auth(self, header: str | None) -> bool:
        """Whether an Authorization header lets the request through (always, without users)."""
        if not self.users:
            return True
        credentials = _parse_basic(header)
        if credentials is None:
            return False
        user, password = credentials
        key = hashlib.sha256(user + b"\0" + password).digest()
        with self._lock:
            if key in self._ok:
                return True
        name = user.decode("utf-8", "replace")
        hashed = self.users.get(name)
        # An unknown user costs one bcrypt too, with a real user's hash: the time of an answer
        # does not tell which user names exist.
        ok = _bcrypt_check(password, hashed if hashed is not None
                           else next(iter(self.users.values())))
        if not (ok and hashed is not None):
            return False
        with self._lock:
            if len(self._ok) >= AUTH_CACHE_SIZE:
                self._ok.clear()
            self._ok.add(key)
        return True


def _parse_basic(header: str | None) -> tuple[bytes, bytes] | None:
    if not header:
        return None
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic" or not encoded or encoded != encoded.strip():
        return None
    try:
        decoded = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
    user, colon, password = decoded.partition(b":")
    return (user, password) if colon else None


def _bcrypt_check(password: bytes, hashed: bytes) -> bool:
    import bcrypt
    try:
        return bcrypt.checkpw(password, hashed)  # compares in constant time
    except ValueError:  # bcrypt 5 refuses passwords over 72 bytes
        return False


# --- loading ------------------------------------------------------------------------------

def load(path: str | os.PathLike) -> WebConfig:
    """Reads and checks a web configuration file; raises WebConfigError."""
    path = pathlib.Path(path).absolute()
    try:
        import yaml
    except ModuleNotFoundError:
        raise WebConfigError(f"--web.config.file {path}: reading it needs PyYAML: pip install "
                             "'crossover_tf[exporter]'") from None
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise WebConfigError(f"--web.config.file {path}: cannot read it: {err}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise WebConfigError(f"{path}: not valid YAML: {err}") from None
    if raw is None:
        raw = {}  # an empty file: plain HTTP, as in exporter-toolkit
    where = str(path)
    _check_keys(raw, TOP_KEYS, where)
    tls_raw = raw.get("tls_server_config")
    tls = None if tls_raw is None else _load_tls(tls_raw, path.parent, where)
    users_raw = raw.get("basic_auth_users")
    users = {} if users_raw is None else _load_users(users_raw, where)
    return WebConfig(path, tls, users)


def _check_keys(section: Any, known: Iterable[str], where: str) -> None:
    if not isinstance(section, dict):
        raise WebConfigError(f"{where}: must be a mapping of keys to values, not "
                             f"{type(section).__name__}")
    for key in section:
        if key in known:
            continue
        if key in UNSUPPORTED_KEYS:
            raise WebConfigError(f"{where}: {key!r} (an exporter-toolkit setting) is not "
                                 f"supported by this exporter; the keys it takes are "
                                 f"{', '.join(known)}")
        raise WebConfigError(f"{where}: unknown key {key!r} (a typo?); the keys it takes are "
                             f"{', '.join(known)}")


def _string(section: dict, key: str, where: str) -> str | None:
    value = section.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise WebConfigError(f"{where}: {key} must be a non-empty string")
    return value


def _file(section: dict, key: str, directory: pathlib.Path, where: str) -> pathlib.Path | None:
    value = _string(section, key, where)
    if value is None:
        return None
    path = directory / value  # an absolute value stays as it is
    try:
        with open(path, "rb"):
            pass
    except OSError as err:
        raise WebConfigError(f"{where}: {key} {path}: {err.strerror or err}") from None
    return path


def _load_tls(section: Any, directory: pathlib.Path, config: str) -> TLSConfig:
    where = f"{config}: tls_server_config"
    _check_keys(section, TLS_KEYS, where)
    cert = _file(section, "cert_file", directory, where)
    key = _file(section, "key_file", directory, where)
    if cert is None or key is None:
        raise WebConfigError(f"{where}: needs both cert_file and key_file")
    auth = _string(section, "client_auth_type", where) or "NoClientCert"
    ca = _file(section, "client_ca_file", directory, where)
    if auth in UNSUPPORTED_CLIENT_AUTH:
        raise WebConfigError(f"{where}: client_auth_type {auth} is not supported here (Python's "
                             f"ssl cannot take a client certificate without verifying it); use "
                             f"VerifyClientCertIfGiven or RequireAndVerifyClientCert")
    if auth not in CLIENT_AUTH:
        raise WebConfigError(f"{where}: client_auth_type {auth!r} is none of "
                             f"{', '.join([*CLIENT_AUTH, *UNSUPPORTED_CLIENT_AUTH])}")
    if auth != "NoClientCert" and ca is None:
        raise WebConfigError(f"{where}: client_auth_type {auth} needs client_ca_file, the CA "
                             f"that signs the clients' certificates")
    if auth == "NoClientCert" and ca is not None:
        raise WebConfigError(f"{where}: client_ca_file is given without a client_auth_type "
                             f"(VerifyClientCertIfGiven or RequireAndVerifyClientCert)")
    versions = {}
    for name in ("min_version", "max_version"):
        value = _string(section, name, where)
        if value is not None and value not in TLS_VERSIONS:
            raise WebConfigError(f"{where}: {name} {value!r} is none of "
                                 f"{', '.join(TLS_VERSIONS)}")
        versions[name] = value
    low, high = versions["min_version"] or "TLS12", versions["max_version"]
    if high is not None and TLS_VERSIONS[high] < TLS_VERSIONS[low]:
        raise WebConfigError(f"{where}: max_version {high} is below min_version {low}")

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.minimum_version = TLS_VERSIONS[low]
        if high is not None:
            context.maximum_version = TLS_VERSIONS[high]
    except (ValueError, ssl.SSLError) as err:
        raise WebConfigError(f"{where}: this Python's OpenSSL cannot do {low}..{high}: "
                             f"{err}") from None
    try:
        context.load_cert_chain(certfile=str(cert), keyfile=str(key))
    except (OSError, ssl.SSLError) as err:
        raise WebConfigError(f"{where}: cert_file {cert} and key_file {key} cannot be used "
                             f"together (not PEM, or the key does not match the certificate): "
                             f"{err}") from None
    if ca is not None:
        try:
            context.load_verify_locations(cafile=str(ca))
        except (OSError, ssl.SSLError) as err:
            raise WebConfigError(f"{where}: client_ca_file {ca} is not a PEM certificate: "
                                 f"{err}") from None
    context.verify_mode = CLIENT_AUTH[auth]
    return TLSConfig(cert, key, auth, ca, low, high, context)


def _load_users(section: Any, config: str) -> dict[str, bytes]:
    where = f"{config}: basic_auth_users"
    if not isinstance(section, dict):
        raise WebConfigError(f"{where}: must map each user name to a bcrypt hash")
    try:
        import bcrypt
    except ModuleNotFoundError:
        raise WebConfigError(f"{where}: checking passwords needs bcrypt: pip install "
                             "'crossover_tf[exporter]'") from None
    users = {}
    for name, hashed in section.items():
        if not isinstance(name, str) or not name:
            raise WebConfigError(f"{where}: a user name is empty or not a string")
        if ":" in name:
            raise WebConfigError(f"{where}: user {name!r}: a basic-auth user name cannot "
                                 f"contain ':'")
        # The value is never echoed: it may be a password put there by mistake.
        refusal = (f"{where}: user {name!r}: the value is not a bcrypt hash (make one with "
                   f"`htpasswd -nBC 12 '' | tr -d ':\\n'`, or bcrypt.hashpw in Python; "
                   f"docs/exporter.md)")
        if not isinstance(hashed, str) or not hashed.startswith("$2"):
            raise WebConfigError(refusal)
        try:
            bcrypt.checkpw(b"", hashed.encode())  # a malformed hash raises "Invalid salt"
        except ValueError:
            raise WebConfigError(refusal) from None
        users[name] = hashed.encode()
    return users


# --- serving ------------------------------------------------------------------------------

def is_loopback(address: str) -> bool:
    """Whether every address `address` binds to is a loopback one ("" and 0.0.0.0: none)."""
    try:
        infos = socket.getaddrinfo(address or None, 0, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise ValueError(f"--address {address!r}: {err}") from None
    return all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S  # an idle or slow client cannot hold a thread for ever

    def log_message(self, format: str, *args: Any) -> None:
        """Logs nothing (as prometheus_client's handler)."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    tls: ssl.SSLContext | None = None

    def finish_request(self, request: socket.socket, client_address: Any) -> None:
        """Runs in the connection's own thread: the TLS handshake first, where configured."""
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        secure = self._handshake(request, client_address)
        if secure is None:
            return
        try:
            super().finish_request(secure, client_address)
        finally:
            try:
                secure.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            secure.close()

    def _handshake(self, request: socket.socket, client_address: Any) -> ssl.SSLSocket | None:
        request.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            first = request.recv(1, socket.MSG_PEEK)
            if not first:
                return None  # connected and closed: a TCP probe
            if first != b"\x16":  # not a TLS handshake record: plain HTTP, most likely
                _answer_plain_http(request)
                return None
            return self.tls.wrap_socket(request, server_side=True)  # handshakes, bounded
        except ssl.SSLEOFError:
            pass  # closed mid-handshake: a probe, a client that gave up
        except ssl.SSLError as err:
            print(f"crossover lease exporter: TLS handshake with {client_address[0]} failed: "
                  f"{err.reason or err}", file=sys.stderr, flush=True)
        except OSError:
            pass  # a timeout, a reset: the client's business
        return None

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer is not the exporter's error (no traceback)."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError, ssl.SSLError)):
            super().handle_error(request, client_address)


def _answer_plain_http(request: socket.socket) -> None:
    """Tells a plain-HTTP client it reached an HTTPS port. What it sent is read first, and
    the end of it awaited (bounded) after the answer: closing a socket with unread data resets
    the connection, and the client could lose the answer."""
    request.settimeout(1.0)
    try:
        request.recv(65536)
        request.sendall(_PLAIN_HTTP_ANSWER)
        request.shutdown(socket.SHUT_WR)
        for _ in range(16):  # bounded: 16 reads of at most 1 s
            if not request.recv(65536):
                break
    except OSError:
        pass


def protect(app: Callable, web: WebConfig) -> Callable:
    """The WSGI application behind basic auth (as it is, without users)."""
    if not web.users:
        return app

    def authenticated(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if web.check_basic_auth(environ.get("HTTP_AUTHORIZATION")):
            return app(environ, start_response)
        start_response("401 Unauthorized", [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"')])
        return [b"Unauthorized\n"]

    return authenticated


def start_server(address: str, port: int, app: Callable, web: WebConfig | None = None
                 ) -> WSGIServer:
    """Serves `app` on address:port (port 0: a free one; server.server_address says which) in
    a daemon thread, with TLS and basic auth as `web` says (None: plain HTTP, no auth).
    Raises OSError where the port cannot be bound."""
    infos = socket.getaddrinfo(address or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]

    class Server(_Server):
        address_family = family
        tls = web.tls.context if web is not None and web.tls is not None else None

    server = make_server(sockaddr[0], port, protect(app, web) if web else app, Server,
                         handler_class=_Handler)
    threading.Thread(target=server.serve_forever, name="crossover-exporter-http",
                     daemon=True).start()
    return server
