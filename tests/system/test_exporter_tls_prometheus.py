"""The protected exporter against a real Prometheus server: TLS and basic auth from a
--web.config.file (crossover_tf/node/web_config.py, docs/exporter.md "Who may read the
metrics"), served on every interface as the recipes run it.

The exporter serves a lease the core's CLI holds; three Prometheus servers (Debian's 2.42,
scripts/install_prometheus.sh) scrape it at once: one as the docs configure it (https, the CA,
the password) stores the lease's series; one with a wrong password gets 401 and one over plain
HTTP gets 400, and both see the target down and store nothing of the lease. A client without
credentials gets 401, plain HTTP a 400 that says HTTPS, and neither any metric. About 10 s (the
first scrape comes ~5 s after Prometheus starts), so not marked slow.
"""
from __future__ import annotations

import base64
import contextlib
import pathlib
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Iterator

import pytest

from exporter_tls import PASSWORD, USER, make_pki, tls_and_auth_config, write_web_config
from lease_helpers import wait_for
from prometheus_server import prometheus_servers
from service import free_port
from crossover_tf.lease import segments

pytest.importorskip("prometheus_client", reason="prometheus-client (scripts/install.sh)")
pytest.importorskip("yaml", reason="PyYAML (the exporter extra; scripts/install.sh)")
pytest.importorskip("bcrypt", reason="bcrypt (the exporter extra; scripts/install.sh)")

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture
def prometheus_factory(tmp_path):
    yield from prometheus_servers(tmp_path / "prometheus")


@contextlib.contextmanager
def protected_exporter(leases: pathlib.Path, web_config: pathlib.Path, env: dict[str, str]
                       ) -> Iterator[int]:
    """The exporter as the recipes run it: every interface, TLS and basic auth."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "crossover_tf.lease", "exporter", "--port",
                             str(port), "--address", "0.0.0.0", "--web.config.file",
                             str(web_config), "--lease_dir", str(leases)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        assert f"serving https://0.0.0.0:{port}/metrics" in line, line + proc.stdout.read()
        assert "basic auth (1 user)" in line, line
        yield port
    finally:
        proc.kill()
        proc.wait()


def fetch(url: str, context: ssl.SSLContext | None = None, auth: str | None = None
          ) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": auth} if auth else {})
    opener = (urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                          urllib.request.HTTPSHandler(context=context))
              if context else _OPENER)
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_prometheus_scrapes_the_exporter_through_tls_and_basic_auth(
        tmp_path, lease_group, lease_cli, child_env, prometheus_factory):
    pki = make_pki(tmp_path / "pki")
    web_config = write_web_config(tmp_path / "web-config.yml", tls_and_auth_config(pki))
    leases = tmp_path / "leases"
    leases.mkdir(mode=0o700)
    env = {**child_env, segments.LEASE_DIR_ENV: str(leases)}
    holder = subprocess.Popen([str(lease_cli), "hold", lease_group, "dev",
                               str(tmp_path / "ready")],
                              env={**env, "CROSSOVER_LEASE_JOB": "jobA"})
    try:
        wait_for((tmp_path / "ready").exists, 30, "the holder")
        with protected_exporter(leases, web_config, env) as port:
            target = f"127.0.0.1:{port}"
            tls = {"ca_file": str(pki.ca_cert)}
            prom = prometheus_factory([target], scheme="https", tls_config=tls,
                                      basic_auth={"username": USER, "password": PASSWORD})
            wrong = prometheus_factory([target], scheme="https", tls_config=tls,
                                       basic_auth={"username": USER, "password": "guess"})
            plain = prometheus_factory([target], basic_auth={"username": USER,
                                                             "password": PASSWORD})

            prom.wait_for_targets_up(timeout_s=30)
            members = prom.wait_for(f'crossover_lease_members{{group="{lease_group}"}} == 1',
                                    timeout_s=30)
            holding = prom.query(f'crossover_lease_holding{{group="{lease_group}"}}')
            assert [h["metric"]["crossover_job"] for h in holding] == ["jobA"], holding
            assert members[0]["metric"]["instance"] == target, members

            def down_with(server, words: str):
                def check():
                    (t,) = server.targets()
                    return t if t["health"] == "down" and words in t["lastError"] else None
                return server.wait_for(check, timeout_s=30, what=f"target down ({words})")

            assert "401" in down_with(wrong, "401")["lastError"]
            assert "400" in down_with(plain, "400")["lastError"]
            for server in (wrong, plain):
                assert server.query('{__name__=~"crossover_lease_.+"}') == []
                assert server.query_value(f'up{{instance="{target}"}}') == 0

            # By hand: no password, a wrong one, plain HTTP; then as Prometheus does.
            context = ssl.create_default_context(cafile=str(pki.ca_cert))
            url = f"https://127.0.0.1:{port}/metrics"
            good = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            bad = "Basic " + base64.b64encode(f"{USER}:guess".encode()).decode()
            for auth in (None, bad):
                status, body = fetch(url, context, auth)
                assert status == 401 and "crossover_lease" not in body, (auth, status, body)
            status, body = fetch(f"http://127.0.0.1:{port}/metrics", auth=good)
            assert status == 400 and "HTTPS" in body and "crossover_lease" not in body, body
            status, body = fetch(url, context, good)
            assert status == 200 and f'group="{lease_group}"' in body, (status, body[:500])
    finally:
        holder.kill()
        holder.wait()
