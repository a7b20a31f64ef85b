"""The exporter's TLS and basic auth: `--web.config.file`, as the Prometheus exporters have it.

The file is the one the Prometheus exporters (node_exporter and the others built on
exporter-toolkit) take with the same flag, so that one file, one habit and one scrape config
serve them all (docs/exporter.md, "Who may read the metrics"):

    tls_server_config:
      cert_file: server.crt      # PEM; a relative path is relative to this file's directory
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional: NoClientCert (default),
      client_ca_file: ca.crt                         # VerifyClientCertIfGiven, or this one
      client_allowed_sans: [prometheus.example]      # optional, needs RequireAndVerify...
      min_version: TLS12         # TLS10..TLS13, default TLS12; max_version likewise
    basic_auth_users:
      prometheus: $2b$12$...     # a bcrypt hash of the password, never the password

Everything is checked when the file is loaded (at start, and again when it changes: the one
request that finds it changed pays for the re-read, a bcrypt per user and the decoy's), never
on a scrape that finds it unchanged: an unknown key (a typo
would otherwise silently turn protection off), a toolkit key this exporter does not implement,
a missing or unreadable file, a key that does not match its certificate, a client-auth policy
without its CA (or a CA without a policy), client_allowed_sans without required client
certificates, a value that is not a bcrypt hash. Each refusal is a WebConfigError (a
ValueError: at start the command exits 2) that names the file and the key, never a user's hash
or password. The file is re-read while serving (LiveWebConfig) when it, or a certificate, key
or CA it names, changes, and on SIGHUP (exporter.py); a file that fails to load, or that would
serve another scheme or without any client authentication where the one in force has some, is
refused and the one in force kept, with a line on stderr that says why.

The server (start_server) is prometheus_client's WSGI application behind our own WSGI server,
a thread per connection, not prometheus_client's start_http_server(certfile=...): that one
does the TLS handshake in its one accepting thread, so a client that connects and sends nothing
stalls every other scrape. Here the listening socket stays plain; each connection's thread
peeks at its first byte, answers plain HTTP with a 400 that says so (as Go's servers do), and
does the handshake itself. Hostile clients are bounded (issue 59): a handshake has a deadline
(HANDSHAKE_TIMEOUT_S) and a connection another (CONNECTION_DEADLINE_S), whole, not per read; at
most MAX_CONNECTIONS are served at once, and a new one closes the oldest (slow clients cannot
keep a scrape out, and the threads and files stay bounded); accept() backs off when the process
is out of files instead of spinning; the soft open-file limit is raised to the hard one at
start, as Go's runtime does for node_exporter.

Basic auth wraps the application as exporter-toolkit's does: one bcrypt check at a time (a
flood of guesses costs one core, not all), and each outcome, success or failure, cached by the
SHA-256 of user, hash and password, so that repeated credentials, Prometheus's or a guesser's,
cost one bcrypt in all. Successes and failures are cached apart, each bounded, so that guesses
cannot push the right password out. A user name that does not exist is checked against a decoy
hash of the users' (highest) cost, made at load, so the time of a 401 does not tell which names
exist.

This module needs neither prometheus_client nor TensorFlow: PyYAML reads the file and bcrypt
checks the passwords, both in the exporter extra (imported only when a file is given).
"""
from __future__ import annotations

import base64
import binascii
import collections
import dataclasses
import errno
import hashlib
import ipaddress
import os
import pathlib
import re
import resource
import secrets
import socket
import ssl
import sys
import threading
import time
from typing import Any, Callable, Iterable
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer

HANDSHAKE_TIMEOUT_S = 10.0    # a TLS client's first byte and whole handshake
CONNECTION_DEADLINE_S = 30.0  # a connection's whole life: handshake, request and answer
REQUEST_TIMEOUT_S = 10.0      # each read of a request and write of its answer
MAX_CONNECTIONS = 1024        # served at once; a new one beyond closes the oldest
FILES_KEPT = 64               # open files the cap leaves free (lease reads, the listener)
LISTEN_BACKLOG = 128          # connections the kernel queues before accept()
ACCEPT_BACKOFF_S = (0.005, 1.0)  # out of files: accept() again after 5 ms, doubling to 1 s
REAP_INTERVAL_S = 0.25        # how often connections past their deadline are closed
RELOAD_CHECK_S = 1.0          # how often a request looks whether the web config changed
AUTH_CACHE_SIZE = 100         # outcomes of password checks kept, successes and failures each
REALM = "crossover lease exporter"
GIVE_UP = "crossover.connection_closed"  # WSGI environ key: whether the server closed it

TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# exporter-toolkit's client_auth_type values that Python's ssl can do, and how.
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
# ... and those it cannot: Python's ssl cannot ask for a certificate without verifying it.
UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
TOP_KEYS = ("tls_server_config", "basic_auth_users")
TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "client_allowed_sans",
            "min_version", "max_version")
# exporter-toolkit keys not implemented here: refused by name rather than ignored.
UNSUPPORTED_KEYS = {"http_server_config", "cert", "key", "client_ca", "cipher_suites",
                    "curve_preferences", "prefer_server_cipher_suites"}
# The SAN kinds exporter-toolkit matches client_allowed_sans against, as Python's ssl names them.
SAN_KINDS = ("DNS", "email", "URI", "IP Address")
# A bcrypt hash: $2a$, $2b$, $2x$ or $2y$, a cost of 4 to 31, 22 characters of salt, 31 of hash.
_BCRYPT_HASH = re.compile(r"\$2[abxy]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")

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
    allowed_sans: frozenset[str] = frozenset()  # empty: any certificate the CA signed

    def admits(self, peer: dict | None) -> bool:
        """Whether a verified client certificate (ssl's getpeercert()) names one of
        client_allowed_sans, as exporter-toolkit matches them: DNS names, e-mail addresses,
        URIs and IP addresses, exactly (IP addresses as addresses)."""
        if not self.allowed_sans:
            return True
        return not self.allowed_sans.isdisjoint(_peer_sans(peer or {}))


def _canonical_san(value: str) -> str:
    """An IP address in one spelling (ssl writes IPv6 in full, in capitals); others as given."""
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        return value


def _peer_sans(peer: dict) -> set[str]:
    return {_canonical_san(value) if kind == "IP Address" else value
            for kind, value in peer.get("subjectAltName", ()) if kind in SAN_KINDS}


class _AuthCache:
    """Outcomes of password checks by a digest of user, hash and password (never the password
    itself), as exporter-toolkit caches them. Successes and failures are kept apart, each
    bounded (the oldest goes first), so that guesses cannot push the right password out."""

    def __init__(self) -> None:
        self._size = AUTH_CACHE_SIZE
        self._outcomes: dict[bool, dict[bytes, None]] = {True: {}, False: {}}
        self._lock = threading.Lock()

    def get(self, key: bytes) -> bool | None:
        with self._lock:
            for ok, entries in self._outcomes.items():
                if key in entries:
                    return ok
        return None

    def put(self, key: bytes, ok: bool) -> None:
        with self._lock:
            entries = self._outcomes[ok]
            if len(entries) >= self._size:
                del entries[next(iter(entries))]
            entries[key] = None

    def __len__(self) -> int:
        with self._lock:
            return sum(map(len, self._outcomes.values()))


@dataclasses.dataclass
class WebConfig:
    """A loaded --web.config.file: TLS (None: plain HTTP) and basic-auth users (name -> bcrypt
    hash; empty: no basic auth), with the decoy hash an unknown user name is checked against."""
    path: pathlib.Path
    tls: TLSConfig | None
    users: dict[str, bytes]
    decoy: bytes = dataclasses.field(default=b"", repr=False)
    _cache: _AuthCache = dataclasses.field(default_factory=_AuthCache, repr=False)
    _bcrypt_turn: _Turns = dataclasses.field(default_factory=lambda: _Turns(), repr=False)

    @property
    def scheme(self) -> str:
        return "http" if self.tls is None else "https"

    @property
    def client_certificates_required(self) -> bool:
        return self.tls is not None and self.tls.client_auth_type == "RequireAndVerifyClientCert"

    @property
    def authenticates(self) -> bool:
        """Every client proves who it is: a password or a certificate."""
        return bool(self.users) or self.client_certificates_required

    @property
    def protects(self) -> bool:
        """TLS, and every client proves who it is: what serving beyond loopback needs
        (cli.py)."""
        return self.tls is not None and self.authenticates

    def describe(self) -> str:
        parts = [f"TLS (min {self.tls.min_version}, client certificates: "
                 f"{self.tls.client_auth_type})" if self.tls else "no TLS"]
        parts.append(f"basic auth ({len(self.users)} user{'s' * (len(self.users) != 1)})"
                     if self.users else "no basic auth")
        return ", ".join(parts)

    def check_basic_auth(self, header: str | None,
                         give_up: Callable[[], bool] | None = None) -> bool:
        """Whether an Authorization header lets the request through (always, without users).
        A credential costs one bcrypt, once (its outcome is cached); give_up() says when to
        stop waiting for another request's bcrypt (the connection was closed)."""
        if not self.users:
            return True
        credentials = _parse_basic(header)
        if credentials is None:
            return False
        user, password = credentials
        hashed = self.users.get(user.decode("utf-8", "replace"))
        checked = hashed if hashed is not None else self.decoy
        key = hashlib.sha256(b"".join(len(part).to_bytes(8, "big") + part
                                      for part in (user, checked, password))).digest()
        ok = self._cache.get(key)
        if ok is None:
            ok = self._check_once(key, password, checked, hashed is not None, give_up)
        return ok

    def _check_once(self, key: bytes, password: bytes, hashed: bytes, known: bool,
                    give_up: Callable[[], bool] | None) -> bool:
        """One bcrypt at a time; the cache is asked again once it is this request's turn, so
        that concurrent requests with one credential wait for the first one's outcome instead
        of each paying for it. An unknown user pays for the decoy's bcrypt too."""
        if not self._bcrypt_turn.wait(give_up):
            return False
        try:
            ok = self._cache.get(key)
            if ok is None:
                ok = _bcrypt_check(password, hashed) and known
                self._cache.put(key, ok)
            return ok
        finally:
            self._bcrypt_turn.done()


class _Turns:
    """A lock taken in turn, first come first served: a threading.Lock lets a waiter lose to
    later ones again and again, so behind a flood of guesses the right password could wait
    past its connection's deadline (Go's mutex, exporter-toolkit's, turns fair likewise)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._queue: collections.deque[object] = collections.deque()

    def wait(self, give_up: Callable[[], bool] | None = None) -> bool:
        """Waits for this caller's turn; False (and out of the queue) once give_up() says so
        (looked at every 50 ms)."""
        me = object()
        with self._changed:
            self._queue.append(me)
            while self._queue[0] is not me:
                self._changed.wait(0.05)
                if give_up is not None and give_up():
                    self._queue.remove(me)
                    self._changed.notify_all()
                    return False
        return True

    def done(self) -> None:
        """Ends the current turn: the next caller's begins."""
        with self._changed:
            self._queue.popleft()
            self._changed.notify_all()


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


def _decoy_hash(users: dict[str, bytes]) -> bytes:
    """A hash of a random password at the users' highest cost: what an unknown user name is
    checked against, so that it costs what a known one does (exporter-toolkit uses one fixed
    hash of cost 10 whatever the users' cost)."""
    if not users:
        return b""
    import bcrypt
    cost = max(int(hashed[4:6]) for hashed in users.values())
    return bcrypt.hashpw(secrets.token_urlsafe(32).encode(), bcrypt.gensalt(rounds=cost))


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
    return WebConfig(path, tls, users, _decoy_hash(users))


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
    sans = _allowed_sans(section, auth, where)
    return TLSConfig(cert, key, auth, ca, low, high, context, sans)


def _allowed_sans(section: dict, auth: str, where: str) -> frozenset[str]:
    """client_allowed_sans: a list of names, only with certificates required (a client
    without one would otherwise pass unchecked)."""
    sans = section.get("client_allowed_sans")
    if sans is None:
        return frozenset()
    if (not isinstance(sans, list) or not sans
            or not all(isinstance(san, str) and san for san in sans)):
        raise WebConfigError(f"{where}: client_allowed_sans must be a list of names (DNS names, "
                             f"e-mail addresses, URIs, IP addresses)")
    if auth != "RequireAndVerifyClientCert":
        raise WebConfigError(f"{where}: client_allowed_sans needs client_auth_type "
                             f"RequireAndVerifyClientCert (with {auth}, a client without a "
                             f"certificate would pass unchecked)")
    return frozenset(map(_canonical_san, sans))


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
        if not isinstance(hashed, str) or not _BCRYPT_HASH.fullmatch(hashed):
            raise WebConfigError(refusal)
        try:
            bcrypt.checkpw(b"", hashed.encode())  # a salt bcrypt cannot use: "Invalid salt"
        except ValueError:
            raise WebConfigError(refusal) from None
        users[name] = hashed.encode()
    return users


# --- reloading ----------------------------------------------------------------------------

def _say(message: str) -> None:
    print(f"crossover lease exporter: {message}", file=sys.stderr, flush=True)


def _signature(web: WebConfig) -> tuple:
    """What changes when the file, or a file it names, is rewritten or replaced."""
    paths = [web.path]
    if web.tls is not None:
        paths += [web.tls.cert_file, web.tls.key_file, web.tls.client_ca_file]
    stats = []
    for path in paths:
        try:
            st = os.stat(path) if path is not None else None
        except OSError:
            st = None
        stats.append(st and (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(stats)


def _downgrade(old: WebConfig, new: WebConfig) -> str | None:
    """Why `new` may not replace `old` while serving (None: it may): cli.py decided at start
    where to listen for the scheme and protection in force."""
    if new.scheme != old.scheme:
        return f"it would serve {new.scheme} where {old.scheme} is served"
    if old.authenticates and not new.authenticates:
        return ("it would serve less protected: no basic_auth_users and no required client "
                "certificate")
    return None


class LiveWebConfig:
    """The web config in force. Re-read when its file, or a certificate, key or CA it names,
    changes (looked at by the next request, at most once per RELOAD_CHECK_S: exporter-toolkit
    reads the file on every request), or when reload() is called (SIGHUP, exporter.py). A file
    that does not load or would downgrade (_downgrade) is refused, and the one in force kept."""

    def __init__(self, web: WebConfig) -> None:
        self._web = web
        self._seen = _signature(web)
        self._checked_at = time.monotonic()
        self._lock = threading.Lock()

    @property
    def path(self) -> pathlib.Path:
        return self._web.path

    def current(self) -> WebConfig:
        """The config in force, re-read first if it changed (by one request; the others go on
        with the one in force meanwhile)."""
        if (time.monotonic() - self._checked_at >= RELOAD_CHECK_S
                and self._lock.acquire(blocking=False)):
            try:
                self._checked_at = time.monotonic()
                if _signature(self._web) != self._seen:
                    self._reload()
            finally:
                self._lock.release()
        return self._web

    def reload(self) -> None:
        """Re-reads the file now, changed or not."""
        with self._lock:
            self._reload()

    def _reload(self) -> None:
        # Taken before reading: a file written while it is read (a certificate, then its key)
        # differs from this next time and is read again, never taken as seen.
        seen = _signature(self._web)
        try:
            new = load(self._web.path)
        except WebConfigError as err:
            _say(f"{err}; the web config in force is kept")
        else:
            problem = _downgrade(self._web, new)
            if problem is None:
                self._web = new
                _say(f"{new.path}: re-read ({new.describe()})")
            else:
                _say(f"{new.path}: not re-read: {problem}; the web config in force is kept "
                     f"(restart the exporter to change it)")
        self._seen = seen


# --- serving ------------------------------------------------------------------------------

def is_loopback(address: str) -> bool:
    """Whether every address `address` binds to is a loopback one ("" and 0.0.0.0: none)."""
    try:
        infos = socket.getaddrinfo(address or None, 0, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise ValueError(f"--address {address!r}: {err}") from None
    return all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def raise_open_file_limit() -> None:
    """Raises the soft RLIMIT_NOFILE to the hard one, as Go's runtime does for node_exporter:
    systemd starts services at a soft 1,024 (kept low for select(), which nothing here uses),
    too few beside hundreds of clients. Where the kernel refuses (a hard limit of "unlimited"),
    the soft one stays."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def _connection_cap() -> int:
    """MAX_CONNECTIONS, or fewer where the open-file limit would run out first (accept()
    failing for want of files cannot close the oldest connection)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, soft - FILES_KEPT))


@dataclasses.dataclass(eq=False)
class _Connection:
    """An accepted connection: the socket that owns its file (the accepted one, then its TLS
    wrapper), when it came and must be done by, and whether the server closed it."""
    sock: socket.socket
    accepted: float
    deadline: float
    closed: threading.Event = dataclasses.field(default_factory=threading.Event)


_CLIENT_GONE = (ConnectionError, TimeoutError, ssl.SSLError)  # a client that went away, or was cut


class _AnswerHandler(ServerHandler):
    def log_exception(self, exc_info: Any) -> None:
        """A client gone mid-answer (or cut at its deadline) is not the exporter's error: no
        traceback (wsgiref leaves out only some of them)."""
        if not isinstance(exc_info[1], _CLIENT_GONE):
            super().log_exception(exc_info)


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S  # per read; the connection's deadline bounds the whole

    def __init__(self, request: socket.socket, client_address: Any, server: _Server,
                 connection: _Connection) -> None:
        self.connection_state = connection
        super().__init__(request, client_address, server)

    def handle(self) -> None:
        """One request, as WSGIRequestHandler.handle, answered by _AnswerHandler."""
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.requestline = self.request_version = self.command = ""
            self.send_error(414)
            return
        if not self.parse_request():  # an error answer is sent
            return
        handler = _AnswerHandler(self.rfile, self.wfile, self.get_stderr(), self.get_environ(),
                                 multithread=False)
        handler.request_handler = self  # as wsgiref's: for its logging
        handler.run(self.server.get_app())

    def get_environ(self) -> dict:
        """The request's environ, with GIVE_UP: basic auth stops waiting once it is set."""
        environ = super().get_environ()
        environ[GIVE_UP] = self.connection_state.closed.is_set
        return environ

    def log_message(self, format: str, *args: Any) -> None:
        """Logs nothing (as prometheus_client's handler)."""


class _Server(WSGIServer):
    """A thread per connection, at most MAX_CONNECTIONS of them, each closed at its deadline
    by a reaper thread (a shutdown() of its socket wakes the thread wherever it waits)."""
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple, web: LiveWebConfig | None) -> None:
        self.web = web
        self.tls = web is not None and web.current().tls is not None  # fixed: see _downgrade
        self.max_connections = _connection_cap()
        self.handshake_s, self.deadline_s = HANDSHAKE_TIMEOUT_S, CONNECTION_DEADLINE_S
        self._connections: list[_Connection] = []  # oldest first
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._backoff_s = 0.0
        super().__init__(address, _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        """accept(); out of files, it waits before the next try instead of spinning (the
        connection stays in the backlog, and the listening socket readable)."""
        try:
            request = super().get_request()
        except OSError as err:
            if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                low, high = ACCEPT_BACKOFF_S
                if not self._backoff_s:
                    _say(f"cannot accept a connection: {err.strerror}; retrying, {low * 1e3:.0f} "
                         f"ms to {high:.0f} s apart")
                self._backoff_s = min(high, max(low, 2 * self._backoff_s))
                time.sleep(self._backoff_s)
            raise
        self._backoff_s = 0.0
        return request

    def process_request(self, request: socket.socket, client_address: Any) -> None:
        """Admits the connection (closing the oldest beyond the cap) and serves it in a thread
        of its own."""
        now = time.monotonic()
        conn = _Connection(request, now, now + (self.handshake_s if self.tls else self.deadline_s))
        with self._lock:
            live = [c for c in self._connections if not c.closed.is_set()]
            for oldest in live[:max(0, len(live) + 1 - self.max_connections)]:
                self._cut(oldest)
            self._connections.append(conn)
        try:
            threading.Thread(target=self._serve, args=(conn, client_address),
                             name="crossover-exporter-connection", daemon=True).start()
        except RuntimeError:  # no thread to be had: closed, not served
            self._close(conn)

    def _serve(self, conn: _Connection, client_address: Any) -> None:
        try:
            if self.tls and not self._handshake(conn, client_address):
                return
            _Handler(conn.sock, client_address, self, conn)
        except Exception:
            self.handle_error(conn.sock, client_address)
        finally:
            self._close(conn)

    def _handshake(self, conn: _Connection, client_address: Any) -> bool:
        """The TLS handshake, in the connection's thread, bounded by handshake_s as a whole;
        then the connection's own deadline. False: the connection is done with."""
        web = self.web.current()
        conn.sock.settimeout(self.handshake_s)
        try:
            first = conn.sock.recv(1, socket.MSG_PEEK)
            if not first:
                return False  # connected and closed: a TCP probe
            if first != b"\x16":  # not a TLS handshake record: plain HTTP, most likely
                _answer_plain_http(conn.sock)
                return False
            with self._lock:  # the TLS socket takes over the file: _cut must see which owns it
                if conn.closed.is_set():
                    return False
                conn.sock = web.tls.context.wrap_socket(conn.sock, server_side=True,
                                                        do_handshake_on_connect=False)
            conn.sock.do_handshake()
        except ssl.SSLEOFError:
            return False  # closed mid-handshake: a probe, a client that gave up
        except ssl.SSLError as err:
            _say(f"TLS handshake with {client_address[0]} failed: {err.reason or err}")
            return False
        except OSError:
            return False  # a timeout, a reset, the deadline: the client's business
        if not web.tls.admits(conn.sock.getpeercert()):
            _say(f"TLS client {client_address[0]}: its certificate has none of "
                 f"client_allowed_sans")
            return False
        with self._lock:
            conn.deadline = conn.accepted + self.deadline_s
        return True

    def _cut(self, conn: _Connection) -> None:
        """Closes a connection's both ways from another thread, under self._lock (so that its
        file is still its own); its thread then finds it closed and ends."""
        conn.closed.set()
        try:
            socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)  # not SSLSocket's: no unwrap
        except OSError:
            pass

    def _close(self, conn: _Connection) -> None:
        """The connection's own thread, at its end: forgotten, then its file closed."""
        with self._lock:
            if conn in self._connections:
                self._connections.remove(conn)
            conn.closed.set()
        try:
            socket.socket.shutdown(conn.sock, socket.SHUT_WR)  # the answer's end, then close
        except OSError:
            pass
        conn.sock.close()

    def reap_forever(self) -> None:
        """Closes the connections past their deadline, until server_close()."""
        while not self._stopped.wait(REAP_INTERVAL_S):
            now = time.monotonic()
            with self._lock:
                for conn in self._connections:
                    if conn.deadline <= now and not conn.closed.is_set():
                        self._cut(conn)

    def server_close(self) -> None:
        self._stopped.set()
        super().server_close()
        with self._lock:
            for conn in self._connections:
                self._cut(conn)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer is not the exporter's error (no traceback)."""
        if not isinstance(sys.exc_info()[1], _CLIENT_GONE):
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
        for _ in range(16):  # bounded: 16 reads of at most 1 s, and the deadline
            if not request.recv(65536):
                break
    except OSError:
        pass


def protect(app: Callable, web: LiveWebConfig) -> Callable:
    """The WSGI application behind the basic auth of the web config in force."""

    def authenticated(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if web.current().check_basic_auth(environ.get("HTTP_AUTHORIZATION"),
                                          environ.get(GIVE_UP)):
            return app(environ, start_response)
        start_response("401 Unauthorized", [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"')])
        return [b"Unauthorized\n"]

    return authenticated


def start_server(address: str, port: int, app: Callable, web: WebConfig | None = None
                 ) -> _Server:
    """Serves `app` on address:port (port 0: a free one; server.server_address says which) in
    daemon threads, with TLS and basic auth as `web` says (None: plain HTTP, no auth), re-read
    when it changes (server.web.reload() re-reads it at once). Raises the soft open-file limit
    first. Raises OSError where the port cannot be bound."""
    raise_open_file_limit()
    infos = socket.getaddrinfo(address or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]

    class Server(_Server):
        address_family = family

    live = LiveWebConfig(web) if web is not None else None
    server = Server((sockaddr[0], port), live)
    server.set_app(protect(app, live) if live is not None else app)
    for target, name in ((server.serve_forever, "crossover-exporter-http"),
                         (server.reap_forever, "crossover-exporter-deadlines")):
        threading.Thread(target=target, name=name, daemon=True).start()
    return server
