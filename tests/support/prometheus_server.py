"""A real Prometheus server, started as a plain process, for the tests that scrape the exporter.

PrometheusServer starts Debian's `prometheus` (2.42; scripts/install_prometheus.sh installs it)
the way /work/shared/platform-notes.md found it working here: a plain process with a scrape
config file, its storage and its log (stdout and stderr) in one directory, listening on
127.0.0.1 only, on a free port. It scrapes the given targets ("127.0.0.1:PORT") every
scrape_interval_s (1 s by default) in one scrape job (`job="crossover"` on every series it
stores; scheme, tls_config and basic_auth as given, for a protected exporter), and answers
PromQL through its HTTP API: query(), query_range(), targets(), wait_for() and
wait_for_targets_up(), every call and every wait bounded. stop() ends it by pid
(SIGTERM, then SIGKILL after STOP_TIMEOUT_S) and may be called any number of times.

Timing (2 cores): ready in well under a second, but Prometheus hands its targets to the scrape
manager only every 5 s (not configurable in 2.42), so the first scrape, and the first answer
to a query of a target's series, comes about 5-7 s after start: give first waits 20 s or more.

Where `prometheus` is not installed, start() raises PrometheusUnavailable (prometheus_servers(),
the body of the tests' fixture, turns that into a skip naming scripts/install_prometheus.sh).
Any other failure to start (a bad flag or config, not ready within START_TIMEOUT_S) raises
PrometheusError with the log's tail: a failed start is an error, never a hang or a skip.

    @pytest.fixture
    def prometheus_factory(tmp_path) -> Iterator[Callable[..., PrometheusServer]]:
        yield from prometheus_servers(tmp_path)

    def test_it(prometheus_factory):
        prom = prometheus_factory([f"127.0.0.1:{port}"])
        prom.wait_for_targets_up(timeout_s=15)
        prom.wait_for("crossover_lease_members == 2", timeout_s=15)
"""
from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Iterator, Sequence

import pytest

from service import StartStopContext, free_port, log_tail, terminate

START_TIMEOUT_S = 30.0     # until /-/ready answers 200
STOP_TIMEOUT_S = 10.0      # after SIGTERM, before SIGKILL
HTTP_TIMEOUT_S = 10.0      # each request to the HTTP API
START_ATTEMPTS = 3         # a free port taken by someone else before prometheus binds it
INSTALL_HINT = "scripts/install_prometheus.sh installs Debian's prometheus"
# Loopback requests must not go through an http_proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PrometheusUnavailable(RuntimeError):
    """No Prometheus binary here; the message says which and how to install it."""


class PrometheusError(RuntimeError):
    """Prometheus failed to start, exited, or its API answered an error; the message says
    which, with the log's tail where it helps."""


def _duration(seconds: float) -> str:
    """Prometheus's duration syntax, in whole milliseconds ("1000ms")."""
    ms = int(round(seconds * 1000))
    if ms <= 0:
        raise ValueError(f"a Prometheus duration must be positive, not {seconds} s")
    return f"{ms}ms"


class PrometheusServer(StartStopContext):
    """One Prometheus server scraping `targets` (each "host:port") every scrape_interval_s.

    Everything it writes lives under base_dir (a new temporary directory, removed on stop, when
    none is given): prometheus.yml, data/ (its TSDB) and prometheus.log."""

    def __init__(self, targets: Sequence[str], scrape_interval_s: float = 1.0,
                 base_dir: pathlib.Path | str | None = None, job_name: str = "crossover",
                 metrics_path: str = "/metrics", binary: str = "prometheus",
                 extra_args: Sequence[str] = (), scheme: str = "http",
                 tls_config: dict[str, Any] | None = None,
                 basic_auth: dict[str, str] | None = None) -> None:
        self.targets_config = [str(t) for t in targets]
        # How it scrapes them: Prometheus's own scrape-config keys (scheme "https", tls_config
        # {ca_file, cert_file, key_file, server_name, insecure_skip_verify}, basic_auth
        # {username, password or password_file}), for a protected exporter.
        self.scheme = scheme
        self.tls_config = tls_config
        self.basic_auth = basic_auth
        self.scrape_interval_s = float(scrape_interval_s)
        self.job_name = job_name
        self.metrics_path = metrics_path
        self.binary = binary
        self.extra_args = list(extra_args)
        self._own_dir = base_dir is None
        self.base = pathlib.Path(tempfile.mkdtemp(prefix="crossover-prometheus-")
                                 if base_dir is None else base_dir)
        self.config = self.base / "prometheus.yml"
        self.storage = self.base / "data"
        self.log = self.base / "prometheus.log"
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise PrometheusError("Prometheus is not started")
        return f"http://127.0.0.1:{self.port}"

    # -- start / stop (StartStopContext makes `with` of them)
    def start(self) -> "PrometheusServer":
        """Writes the config, starts prometheus and waits (bounded) until it is ready."""
        if self.proc is not None:
            raise PrometheusError(f"already started (pid {self.proc.pid})")
        binary = shutil.which(self.binary)
        if binary is None:
            raise PrometheusUnavailable(f"{self.binary!r} is not on PATH ({INSTALL_HINT})")
        self.base.mkdir(parents=True, exist_ok=True)
        self.storage.mkdir(exist_ok=True)
        self._write_config()
        for attempt in range(1, START_ATTEMPTS + 1):
            self.port = free_port()
            with open(self.log, "ab") as sink:
                sink.write(f"--- start {attempt}: port {self.port}\n".encode())
                sink.flush()
                self.proc = subprocess.Popen(
                    [binary, f"--config.file={self.config}",
                     f"--storage.tsdb.path={self.storage}",
                     f"--web.listen-address=127.0.0.1:{self.port}", *self.extra_args],
                    stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    cwd=self.base, start_new_session=True)
            try:
                self._wait_ready()
                return self
            except PrometheusError:
                self._kill()
                if attempt == START_ATTEMPTS or "address already in use" not in self.logs(5):
                    raise
        raise AssertionError("unreachable")

    def _write_config(self) -> None:
        # JSON is YAML: no PyYAML needed to write it.
        interval = _duration(self.scrape_interval_s)
        job: dict[str, Any] = {"job_name": self.job_name, "metrics_path": self.metrics_path,
                               "scheme": self.scheme,
                               "static_configs": [{"targets": self.targets_config}]}
        if self.tls_config is not None:
            job["tls_config"] = self.tls_config
        if self.basic_auth is not None:
            job["basic_auth"] = self.basic_auth
        config = {
            "global": {"scrape_interval": interval, "scrape_timeout": interval,
                       "evaluation_interval": interval},
            "scrape_configs": [job],
        }
        self.config.write_text(json.dumps(config, indent=2) + "\n")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        last = "no answer yet"
        while True:
            if self.proc.poll() is not None:
                raise PrometheusError(f"prometheus exited {self.proc.returncode} before it was "
                                      f"ready:\n{self.logs()}")
            try:
                with _OPENER.open(f"{self.url}/-/ready", timeout=2.0) as response:
                    if response.status == 200:
                        return
                    last = f"HTTP {response.status}"
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}"  # 503 while it replays its WAL
            except (OSError, urllib.error.URLError) as e:
                last = str(e)
            if time.monotonic() > deadline:
                raise PrometheusError(f"prometheus (pid {self.proc.pid}) not ready within "
                                      f"{START_TIMEOUT_S:.0f} s at {self.url}/-/ready "
                                      f"({last}):\n{self.logs()}")
            time.sleep(0.1)

    def logs(self, lines: int = 20) -> str:
        """The last lines of prometheus's output (its log goes to stderr)."""
        return f"--- {self.log} (last {lines} lines):\n{log_tail(self.log, lines)}"

    def _kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            terminate(proc, STOP_TIMEOUT_S)

    def stop(self) -> None:
        """Stops prometheus by pid (SIGTERM, SIGKILL after STOP_TIMEOUT_S); idempotent. Removes
        base_dir if this object made it."""
        self._kill()
        if self._own_dir:
            shutil.rmtree(self.base, ignore_errors=True)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- the HTTP API
    def api(self, path: str, **params: Any) -> Any:
        """GET /api/v1/<path>?params; returns the answer's `data`, or raises PrometheusError
        with its errorType and error."""
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with _OPENER.open(url, timeout=HTTP_TIMEOUT_S) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as e:  # 400/422/503 carry a JSON error
            try:
                body = json.loads(e.read())
            except ValueError:
                raise PrometheusError(f"GET {url}: HTTP {e.code}") from None
        except (OSError, urllib.error.URLError) as e:
            state = "running" if self.running else "not running"
            raise PrometheusError(f"GET {url}: {e} (prometheus {state})") from e
        if body.get("status") != "success":
            raise PrometheusError(f"GET {url}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    @staticmethod
    def _results(data: dict) -> list[dict]:
        if data["resultType"] in ("vector", "matrix"):
            return data["result"]
        return [{"metric": {}, "value": data["result"]}]  # scalar, string

    def query(self, promql: str, time: float | None = None) -> list[dict]:
        """An instant query: one {"metric": {labels}, "value": [ts, "v"]} per series (a scalar
        is one such dict with no labels)."""
        return self._results(self.api("query", query=promql, time=time))

    def query_range(self, promql: str, start: float, end: float, step_s: float = 1.0
                    ) -> list[dict]:
        """A range query: one {"metric": {labels}, "values": [[ts, "v"], ...]} per series."""
        return self._results(self.api("query_range", query=promql, start=start, end=end,
                                      step=step_s))

    def query_value(self, promql: str) -> float | None:
        """The value of a query that returns at most one series (None: none)."""
        results = self.query(promql)
        if len(results) > 1:
            raise PrometheusError(f"{promql!r} returned {len(results)} series, not one: "
                                  f"{[r['metric'] for r in results]}")
        return float(results[0]["value"][1]) if results else None

    def targets(self) -> list[dict]:
        """The active targets (scrapeUrl, health "up"/"down"/"unknown", lastError, ...)."""
        return self.api("targets", state="active")["activeTargets"]

    # -- bounded waits
    def wait_for(self, condition: str | Callable[[], Any], timeout_s: float = 30.0,
                 interval_s: float = 0.25, what: str | None = None) -> Any:
        """Polls until `condition` holds, at most timeout_s: a PromQL string holds when its
        query returns a series (returns them); a callable when it returns something truthy
        (returns that). Errors of the API along the way are retried. Raises TimeoutError with
        `what` (default: the condition), the last answer, the targets' health and the log's
        tail; PrometheusError at once if prometheus exits."""
        check = (lambda: self.query(condition)) if isinstance(condition, str) else condition
        what = what or (condition if isinstance(condition, str)
                        else getattr(condition, "__name__", repr(condition)))
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while True:
            if not self.running:
                raise PrometheusError(f"prometheus is not running while waiting for "
                                      f"{condition!r}:\n{self.logs()}")
            try:
                last = check()
                if last:
                    return last
            except PrometheusError as e:
                last = e
            if time.monotonic() > deadline:
                raise TimeoutError(f"not within {timeout_s:g} s: {what} (last: {last!r}); "
                                   f"targets: {self._describe_targets()}\n{self.logs(10)}")
            time.sleep(interval_s)

    def wait_for_targets_up(self, timeout_s: float = 30.0) -> list[dict]:
        """Waits until every configured target has been scraped successfully (health "up");
        returns the targets."""
        def all_up() -> list[dict] | None:
            targets = self.targets()
            up = {t["labels"].get("instance") for t in targets if t["health"] == "up"}
            return targets if set(self.targets_config) <= up else None
        return self.wait_for(all_up, timeout_s=timeout_s,
                             what=f"every target up ({', '.join(self.targets_config)})")

    def _describe_targets(self) -> str:
        try:
            return "; ".join(f"{t['scrapeUrl']} {t['health']}"
                             + (f" ({t['lastError']})" if t.get("lastError") else "")
                             for t in self.targets()) or "none"
        except PrometheusError as e:
            return f"(unknown: {e})"


def prometheus_servers(base_dir: pathlib.Path) -> Iterator[Callable[..., PrometheusServer]]:
    """The body of a pytest fixture: yields a factory `(targets, scrape_interval_s=1.0, **kw)
    -> started PrometheusServer`, each with its own directory under base_dir; stops every
    server it started afterwards. Skips, naming scripts/install_prometheus.sh, where
    `prometheus` is not installed."""
    if shutil.which("prometheus") is None:
        pytest.skip(f"prometheus is not on PATH ({INSTALL_HINT}; run it as root)")
    started: list[PrometheusServer] = []

    def factory(targets: Sequence[str], scrape_interval_s: float = 1.0,
                **kwargs: Any) -> PrometheusServer:
        server = PrometheusServer(targets, scrape_interval_s,
                                  base_dir=pathlib.Path(base_dir) / f"prometheus{len(started)}",
                                  **kwargs)
        started.append(server)
        return server.start()

    try:
        yield factory
    finally:
        for server in started:
            server.stop()

