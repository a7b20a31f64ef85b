"""The exporter's protection (crossover_tf/node/web_config.py, docs/exporter.md "Who may read
the metrics"): its web configuration file in the Prometheus exporters' format, refused at start
when wrong; the TLS and basic-auth server it makes, served in this process on a loopback port
with a trivial application; the command line's refusal to serve unprotected metrics beyond
loopback; and the recipes that run it.

A real Prometheus server scraping the real exporter through TLS and basic auth is
tests/system/test_exporter_tls_prometheus.py.
"""
from __future__ import annotations

import base64
import http.client
import os
import pathlib
import socket
import ssl
import subprocess
import sys
import time
from typing import Iterator

import pytest

from conftest import REPO_ROOT
from exporter_tls import (PASSWORD, USER, Pki, basic, bcrypt_hash, make_pki,
                          tls_and_auth_config, write_web_config)

pytest.importorskip("yaml", reason="PyYAML (the exporter extra; scripts/install.sh)")
pytest.importorskip("bcrypt", reason="bcrypt (the exporter extra; scripts/install.sh)")

from crossover_tf.node import web_config  # noqa: E402
from crossover_tf.node.web_config import WebConfigError  # noqa: E402


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def load(tmp_path: pathlib.Path, config) -> web_config.WebConfig:
    return web_config.load(write_web_config(tmp_path / "web-config.yml", config))


def refused(tmp_path: pathlib.Path, config) -> str:
    with pytest.raises(WebConfigError) as err:
        load(tmp_path, config)
    message = str(err.value)
    assert "web-config.yml" in message, message  # every refusal names the file
    return message


# --- the file -----------------------------------------------------------------------------

def test_a_full_config_loads_with_paths_relative_to_its_directory(tmp_path, pki):
    (tmp_path / "conf").mkdir()
    for name in ("server.crt", "server.key", "ca.crt"):
        (tmp_path / "conf" / name).write_bytes((pki.dir / name).read_bytes())
    hashed = bcrypt_hash()
    config = web_config.load(write_web_config(tmp_path / "conf" / "web.yml", f"""\
# as in the Prometheus exporters' docs
tls_server_config:
  cert_file: server.crt
  key_file: server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: ca.crt
  min_version: TLS13
basic_auth_users:
  {USER}: {hashed}
"""))
    assert config.tls is not None
    assert config.tls.cert_file == tmp_path / "conf" / "server.crt"
    assert config.tls.client_ca_file == tmp_path / "conf" / "ca.crt"
    assert config.tls.client_auth_type == "RequireAndVerifyClientCert"
    assert config.tls.context.minimum_version == ssl.TLSVersion.TLSv1_3
    assert config.tls.context.verify_mode == ssl.CERT_REQUIRED
    assert set(config.users) == {USER}
    assert config.scheme == "https" and config.protects


def test_tls_defaults_to_tls12_and_no_client_certificate(tmp_path, pki):
    config = load(tmp_path, {"tls_server_config": {"cert_file": str(pki.server_cert),
                                                   "key_file": str(pki.server_key)}})
    assert config.tls.context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert config.tls.context.verify_mode == ssl.CERT_NONE
    assert config.tls.client_auth_type == "NoClientCert"
    # TLS without any client authentication: encrypted, but anyone may read.
    assert config.scheme == "https" and not config.protects


@pytest.mark.parametrize("text", ["", "# nothing\n", "{}\n"])
def test_an_empty_config_is_plain_http_as_in_the_exporter_toolkit(tmp_path, text):
    config = load(tmp_path, text)
    assert config.tls is None and config.users == {}
    assert config.scheme == "http" and not config.protects


def test_basic_auth_without_tls_does_not_protect(tmp_path):
    config = load(tmp_path, {"basic_auth_users": {USER: bcrypt_hash()}})
    assert config.scheme == "http" and not config.protects  # passwords in the clear


def test_refuses_a_missing_or_unreadable_file(tmp_path):
    with pytest.raises(WebConfigError, match="nope.yml"):
        web_config.load(tmp_path / "nope.yml")


@pytest.mark.parametrize("text, words", [
    ("tls_server_config: [\n", "not valid YAML"),
    ("- a list\n", "mapping"),
    ("tls_server_config: 3\n", "tls_server_config"),
    ("basic_auth_users: [prometheus]\n", "basic_auth_users"),
])
def test_refuses_what_is_not_a_config(tmp_path, text, words):
    assert words in refused(tmp_path, text)


@pytest.mark.parametrize("config, key", [
    ({"tls_server_configs": {}}, "tls_server_configs"),          # a typo at the top
    ({"basic_auth_user": {}}, "basic_auth_user"),
    ({"tls_server_config": {"certfile": "x"}}, "certfile"),       # a typo inside
])
def test_refuses_unknown_keys(tmp_path, config, key):
    message = refused(tmp_path, config)
    assert f"unknown key {key!r}" in message, message


@pytest.mark.parametrize("section, key", [
    ("tls_server_config", "cipher_suites"), ("tls_server_config", "curve_preferences"),
    ("tls_server_config", "cert"),
    ("top", "http_server_config"),
])
def test_refuses_exporter_toolkit_keys_it_does_not_implement(tmp_path, pki, section, key):
    tls = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}
    config = ({"tls_server_config": {**tls, key: "x"}} if section == "tls_server_config"
              else {"tls_server_config": tls, key: {}})
    message = refused(tmp_path, config)
    assert key in message and "not supported" in message, message


def test_refuses_missing_certificate_files_and_a_key_that_does_not_match(tmp_path, pki):
    message = refused(tmp_path, {"tls_server_config": {"cert_file": "absent.crt",
                                                       "key_file": str(pki.server_key)}})
    assert str(tmp_path / "absent.crt") in message, message
    message = refused(tmp_path, {"tls_server_config": {"cert_file": str(pki.server_cert)}})
    assert "key_file" in message, message
    message = refused(tmp_path, {"tls_server_config": {"cert_file": str(pki.server_cert),
                                                       "key_file": str(pki.other_key)}})
    assert "server.crt" in message and "other.key" in message, message
    message = refused(tmp_path, {"tls_server_config": {
        "cert_file": str(pki.server_cert), "key_file": str(pki.server_key),
        "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": "no-ca.crt"}})
    assert "no-ca.crt" in message, message


@pytest.mark.parametrize("tls, words", [
    ({"client_auth_type": "Sometimes"}, "client_auth_type"),
    ({"client_auth_type": "RequireAnyClientCert"}, "not supported"),
    ({"client_auth_type": "RequestClientCert"}, "not supported"),
    ({"client_auth_type": "RequireAndVerifyClientCert"}, "client_ca_file"),
    ({"client_auth_type": "VerifyClientCertIfGiven"}, "client_ca_file"),
    ({"client_ca_file": "ca.crt"}, "client_auth_type"),  # a CA without a policy, as the toolkit
    ({"min_version": "TLS14"}, "min_version"),
    ({"min_version": "TLS13", "max_version": "TLS12"}, "max_version"),
])
def test_refuses_bad_tls_settings(tmp_path, pki, tls, words):
    config = {"tls_server_config": {"cert_file": str(pki.server_cert),
                                    "key_file": str(pki.server_key),
                                    **{k: (str(pki.ca_cert) if v == "ca.crt" else v)
                                       for k, v in tls.items()}}}
    message = refused(tmp_path, config)
    assert words in message, message


@pytest.mark.parametrize("users, words", [
    ({USER: "plain-text-password"}, "bcrypt"),
    ({USER: "$2b$10$tooshort"}, "bcrypt"),
    ({USER: 12345}, "bcrypt"),
    ({USER: None}, "bcrypt"),
    ({"a:b": "HASH"}, "':'"),
    ({"": "HASH"}, "empty"),
])
def test_refuses_bad_users_without_echoing_the_value(tmp_path, users, words):
    hashed = bcrypt_hash()
    users = {name: (hashed if value == "HASH" else value) for name, value in users.items()}
    message = refused(tmp_path, {"basic_auth_users": users})
    assert words in message, message
    assert "plain-text-password" not in message and hashed not in message, message


# --- basic auth -----------------------------------------------------------------------------

def test_basic_auth_accepts_only_the_users_password(tmp_path):
    hashed = bcrypt_hash()
    config = load(tmp_path, {"basic_auth_users": {
        USER: hashed, "apache": hashed.replace("$2b$", "$2y$", 1)}})  # htpasswd writes $2y$
    assert config.check_basic_auth(basic(USER, PASSWORD))
    assert config.check_basic_auth(basic(USER, PASSWORD))  # again, from the cache
    assert config.check_basic_auth(basic("apache", PASSWORD))
    assert config.check_basic_auth("basic " + basic(USER, PASSWORD)[6:])  # scheme: any case
    for header in (None, "", basic(USER, PASSWORD + "x"), basic(USER, ""),
                   basic("nobody", PASSWORD), basic(USER.upper(), PASSWORD),
                   basic(USER, "x" * 100), "Basic !!!notbase64", "Bearer abc",
                   "Basic " + base64.b64encode(USER.encode()).decode(),  # no colon
                   basic(USER, PASSWORD).replace("Basic ", "Basic  ")):
        assert not config.check_basic_auth(header), header


def test_without_users_every_request_passes(tmp_path):
    assert load(tmp_path, "").check_basic_auth(None)


# --- the server -----------------------------------------------------------------------------

def hello(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"crossover_lease_members 2\n"]


@pytest.fixture
def serve(tmp_path) -> Iterator:
    servers = []

    def start(config) -> int:
        web = load(tmp_path, config) if config is not None else None
        server = web_config.start_server("127.0.0.1", 0, hello, web)
        servers.append(server)
        return server.server_address[1]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def client_context(pki: Pki, cert: bool = False, **versions) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    if cert:
        context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    for name, value in versions.items():
        setattr(context, name, value)
    return context


def get(port: int, context: ssl.SSLContext | None = None, auth: str | None = None
        ) -> tuple[int, dict[str, str], bytes]:
    conn = (http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
            if context else http.client.HTTPConnection("127.0.0.1", port, timeout=10))
    try:
        conn.request("GET", "/metrics", headers={"Authorization": auth} if auth else {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def test_plain_server_serves_as_before(serve):
    port = serve(None)
    assert get(port)[0] == 200


def test_tls_and_basic_auth(serve, pki):
    port = serve(tls_and_auth_config(pki))
    status, _, body = get(port, client_context(pki), basic(USER, PASSWORD))
    assert status == 200 and body == b"crossover_lease_members 2\n"
    for auth in (None, basic(USER, "wrong"), basic("other", PASSWORD)):
        status, headers, body = get(port, client_context(pki), auth)
        assert status == 401 and b"crossover" not in body, (auth, status, body)
        assert headers["WWW-Authenticate"].startswith("Basic"), headers
    # Plain HTTP to the TLS port: an HTTP answer that says so, nothing else.
    status, _, body = get(port, None, basic(USER, PASSWORD))
    assert status == 400 and b"HTTPS" in body and b"crossover" not in body, (status, body)
    # A client that does not trust the server's certificate gives up.
    with pytest.raises(ssl.SSLCertVerificationError):
        get(port, ssl.create_default_context(cafile=str(pki.other_cert)), basic(USER, PASSWORD))


def test_min_version_is_enforced(serve, pki):
    port = serve(tls_and_auth_config(pki, min_version="TLS13"))
    with pytest.raises(ssl.SSLError):
        get(port, client_context(pki, maximum_version=ssl.TLSVersion.TLSv1_2),
            basic(USER, PASSWORD))
    assert get(port, client_context(pki), basic(USER, PASSWORD))[0] == 200


def test_client_certificates_when_required(serve, pki):
    port = serve({"tls_server_config": {
        "cert_file": str(pki.server_cert), "key_file": str(pki.server_key),
        "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki.ca_cert)}})
    assert get(port, client_context(pki, cert=True))[0] == 200
    with pytest.raises((ssl.SSLError, ConnectionError)):  # TLS 1.3: after the handshake
        get(port, client_context(pki))
    stranger = client_context(pki)
    stranger.load_cert_chain(str(pki.other_cert), str(pki.other_key))  # not by the CA
    with pytest.raises((ssl.SSLError, ConnectionError)):
        get(port, stranger)


def test_a_stalled_client_does_not_hold_up_the_others(serve, pki):
    """prometheus_client's own TLS (start_http_server(certfile=...)) does the handshake in its
    one accepting thread: a client that connects and sends nothing stops every other scrape.
    Here each connection's handshake runs in its own thread, bounded."""
    port = serve(tls_and_auth_config(pki))
    stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    try:
        stalled[1].sendall(b"\x16\x03\x01")  # the start of a ClientHello, then nothing
        start = time.monotonic()
        assert get(port, client_context(pki), basic(USER, PASSWORD))[0] == 200
        assert time.monotonic() - start < 5
    finally:
        for sock in stalled:
            sock.close()


# --- the command line -----------------------------------------------------------------------

def run_exporter(tmp_path: pathlib.Path, *args: str, timeout: float = 60
                 ) -> subprocess.CompletedProcess:
    """The exporter's command as an operator runs it; every case here exits before serving (a
    case that would serve instead times out, and fails)."""
    (tmp_path / "leases").mkdir(mode=0o700, exist_ok=True)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO_ROOT), "CUDA_VISIBLE_DEVICES": "",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run([sys.executable, "-m", "crossover_tf.lease", "exporter", "--port", "1",
                           "--lease_dir", str(tmp_path / "leases"), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO_ROOT)


def test_the_default_address_is_loopback():
    from crossover_tf.node import cli
    args = cli.parser().parse_args(["exporter"])
    assert args.address == "127.0.0.1" and args.web_config_file is None and not args.insecure


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "", "192.0.2.1"])
def test_refuses_to_serve_beyond_loopback_unprotected(tmp_path, address):
    result = run_exporter(tmp_path, "--address", address)
    assert result.returncode == 2, result
    assert "--web.config.file" in result.stderr and "--insecure" in result.stderr, result.stderr
    assert "pids" in result.stderr, result.stderr  # says what would be exposed


@pytest.mark.parametrize("keep, words", [
    ("basic_auth_users", "tls_server_config"),  # passwords in the clear
    ("tls_server_config", "basic_auth_users"),  # encrypted, but anyone may read
])
def test_refuses_a_web_config_that_does_not_protect_beyond_loopback(tmp_path, pki, keep, words):
    config = {keep: tls_and_auth_config(pki)[keep]}
    path = write_web_config(tmp_path / "web.yml", config)
    result = run_exporter(tmp_path, "--address", "0.0.0.0", "--web.config.file", str(path))
    assert result.returncode == 2 and words in result.stderr, result


def test_refuses_a_bad_web_config_at_start(tmp_path):
    path = write_web_config(tmp_path / "web.yml", {"tls_server_config": {"certfile": "x"}})
    result = run_exporter(tmp_path, "--web.config.file", str(path))
    assert result.returncode == 2, result
    assert "web.yml" in result.stderr and "certfile" in result.stderr, result.stderr


# --- the recipes --------------------------------------------------------------------------

def exporter_command_lines() -> list[tuple[str, str]]:
    """(file, command) of every exporter command in deploy/, continuations joined. (The docs
    show the refusal itself: `--address 0.0.0.0` alone, which exits 2.)"""
    out = []
    for path in sorted((REPO_ROOT / "deploy").rglob("*")):
        if not path.is_file() or path.suffix not in (".md", ".yaml", ".sbatch", ".sh"):
            continue
        text = path.read_text().replace("\\\n", " ")
        if path.suffix == ".yaml":  # a JSON-style command list: its words, one line
            text = text.replace('",', " ").replace('"', " ").replace("\n ", " ")
        for line in text.splitlines():
            if "crossover_tf.lease" in line and " exporter" in line:
                out.append((str(path.relative_to(REPO_ROOT)), " ".join(line.split())))
    return out


def test_recipes_serve_beyond_loopback_only_with_tls_and_auth():
    lines = exporter_command_lines()
    assert any(f.startswith("deploy/kubernetes") for f, _ in lines), lines
    for where, line in lines:
        beyond = "--address 0.0.0.0" in line or "--address ::" in line
        assert "--insecure" not in line, (where, line)
        if beyond:
            assert "--web.config.file" in line, (where, line)


def test_daemonset_mounts_its_web_config_secret_and_scrapes_https():
    yaml = pytest.importorskip("yaml")
    (ds,) = [d for d in yaml.safe_load_all(
        (REPO_ROOT / "deploy" / "kubernetes" / "exporter-daemonset.yaml").read_text()) if d]
    pod = ds["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    command = container["command"]
    config = pathlib.PurePosixPath(command[command.index("--web.config.file") + 1])
    (mount,) = [m for m in container["volumeMounts"]
                if config.is_relative_to(m["mountPath"])]
    assert mount.get("readOnly") is True, mount
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["defaultMode"] & 0o077 == 0o040, volume  # no world read of the key
    assert pod["spec"]["securityContext"]["fsGroup"], pod["spec"]["securityContext"]
    assert pod["metadata"]["annotations"]["prometheus.io/scheme"] == "https"
    for probe in ("livenessProbe", "readinessProbe"):  # a probe has no password: TCP only
        assert "tcpSocket" in container[probe] and "httpGet" not in container[probe]
    head = (REPO_ROOT / "deploy" / "kubernetes" / "exporter-daemonset.yaml").read_text()
    for needed in ("kubectl create secret", "basic_auth_users", "basicAuth", "tlsConfig"):
        assert needed in head, needed


def test_docs_say_what_the_metrics_reveal_and_how_to_restrict_them():
    text = (REPO_ROOT / "docs" / "exporter.md").read_text()
    for needed in ("--web.config.file", "tls_server_config", "basic_auth_users", "--insecure",
                   "127.0.0.1", "pid_ns", "bcrypt", "client_auth_type"):
        assert needed in text, needed


@pytest.mark.parametrize("flag, expected", [
    ("127.0.0.1:9555", ("127.0.0.1", 9555)), ("[::1]:9556", ("::1", 9556)),
    (":9557", ("", 9557))])
def test_the_prometheus_listen_flag_names_address_and_port(flag, expected):
    """Prometheus exporters take --web.listen-address HOST:PORT (':PORT' is every interface);
    --address and --port stay as its older spelling, and --lease.dir beside --lease_dir."""
    from crossover_tf.node import cli
    args = cli.parser().parse_args(["exporter", "--web.listen-address", flag,
                                    "--lease.dir", "/tmp/x"])
    assert cli.listen_on(args) == expected and args.lease_dir == "/tmp/x"
    older = cli.parser().parse_args(["exporter", "--address", "127.0.0.2", "--port", "9558"])
    assert cli.listen_on(older) == ("127.0.0.2", 9558)


def test_a_listen_address_beyond_loopback_is_refused_unprotected_and_a_bad_one_named(tmp_path):
    every = run_exporter(tmp_path, "--web.listen-address", ":9559")
    assert every.returncode == 2 and "--web.config.file" in every.stderr, every
    bad = run_exporter(tmp_path, "--web.listen-address", "localhost")
    assert bad.returncode == 2 and "HOST:PORT" in bad.stderr, bad
    too_far = run_exporter(tmp_path, "--web.listen-address", "127.0.0.1:70000")
    assert too_far.returncode == 2, too_far
    assert "--web.listen-address must be in 1-65535" in too_far.stderr, too_far
