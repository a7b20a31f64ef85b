"""Certificates, password hashes and web configuration files for the exporter's TLS and basic
auth tests (crossover_tf/node/web_config.py).

make_pki() makes, with the `openssl` command, a throwaway certificate authority, a server
certificate it signs for 127.0.0.1 and localhost, a client certificate it signs (its SANs
are CLIENT_SANS), and an unrelated self-signed certificate (a key that matches no other), all
valid for two days, in a directory of the test's own. Elliptic-curve keys: fast to make.
Skips where `openssl` is not installed. write_web_config() writes the exporter's
--web.config.file; bcrypt_hash() hashes a password at the lowest bcrypt cost (4) by default, so
that the tests do not spend seconds in bcrypt; basic() makes a basic-auth header, and
client_hello() the first flight of a TLS client.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import pathlib
import shutil
import ssl
import subprocess
from typing import Any

import pytest

USER = "prometheus"
PASSWORD = "correct horse battery staple"
CLIENT_SANS = ("prometheus.test", "spiffe://crossover.test/prometheus")  # the client cert's

_OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = crossover-test
[ca_ext]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
authorityKeyIdentifier = keyid
[client_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectAltName = DNS:prometheus.test,URI:spiffe://crossover.test/prometheus
authorityKeyIdentifier = keyid
"""
_EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclasses.dataclass(frozen=True)
class Pki:
    dir: pathlib.Path
    ca_cert: pathlib.Path
    server_cert: pathlib.Path
    server_key: pathlib.Path
    client_cert: pathlib.Path
    client_key: pathlib.Path
    other_cert: pathlib.Path   # self-signed, not by the CA
    other_key: pathlib.Path


def _openssl(cwd: pathlib.Path, *args: str) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, f"openssl {' '.join(args)}:\n{result.stderr}"


def make_pki(base: pathlib.Path) -> Pki:
    """The certificates and keys in base (created), as PEM files."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed (apt-get install openssl)")
    base.mkdir(parents=True, exist_ok=True)
    config = base / "openssl.cnf"
    config.write_text(_OPENSSL_CONFIG)
    common = ["-config", str(config)]
    _openssl(base, "req", "-x509", *common, "-extensions", "ca_ext", *_EC_KEY, "-days", "2",
             "-subj", "/CN=crossover-test-ca", "-keyout", "ca.key", "-out", "ca.crt")
    for serial, (name, subject) in enumerate((("server", "localhost"),
                                              ("client", USER)), start=2):
        _openssl(base, "req", "-new", *common, *_EC_KEY, "-subj", f"/CN={subject}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr")
        _openssl(base, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey",
                 "ca.key", "-set_serial", str(serial), "-days", "2", "-extfile", str(config),
                 "-extensions", f"{name}_ext", "-out", f"{name}.crt")
    _openssl(base, "req", "-x509", *common, "-extensions", "server_ext", *_EC_KEY, "-days", "2",
             "-subj", "/CN=localhost", "-keyout", "other.key", "-out", "other.crt")
    return Pki(base, base / "ca.crt", base / "server.crt", base / "server.key",
               base / "client.crt", base / "client.key", base / "other.crt", base / "other.key")


def bcrypt_hash(password: str = PASSWORD, cost: int = 4) -> str:
    bcrypt = pytest.importorskip("bcrypt", reason="bcrypt (the exporter extra; scripts/install.sh)")
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=cost)).decode()


def basic(user: str, password: str) -> str:
    """An Authorization header for basic auth."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def write_web_config(path: pathlib.Path, config: Any) -> pathlib.Path:
    """The exporter's web configuration file; a str is written as it is, anything else as JSON
    (JSON is YAML)."""
    path.write_text(config if isinstance(config, str) else json.dumps(config, indent=2) + "\n")
    return path


def tls_and_auth_config(pki: Pki, **tls: Any) -> dict:
    """A web configuration with TLS (the CA-signed server certificate, absolute paths) and one
    basic-auth user, USER with PASSWORD; `tls` adds or replaces tls_server_config keys."""
    return {"tls_server_config": {"cert_file": str(pki.server_cert),
                                  "key_file": str(pki.server_key), **tls},
            "basic_auth_users": {USER: bcrypt_hash()}}


def client_hello() -> bytes:
    """A TLS ClientHello, a real client's first flight: what a slow client sends a byte at a
    time."""
    tls = ssl.create_default_context().wrap_bio(ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(),
                                                server_hostname="localhost")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()
