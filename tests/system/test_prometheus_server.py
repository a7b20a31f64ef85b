"""The real-Prometheus helper (tests/support/prometheus_server.py) works: it scrapes, answers,
stops.

A tiny prometheus_client HTTP server on 127.0.0.1 serves a counter this test increments; a real
Prometheus (Debian's 2.42, scripts/install_prometheus.sh) scrapes it every second. The query
must return the counter's value, and then its new value after the test increments it again:
a server that did not scrape (nothing in its TSDB) or scraped only once fails. Also: a second
target nobody serves is down and times wait_for_targets_up out with the scrape error, a failed
start raises with prometheus's own error instead of hanging, and stop() ends the process and
is idempotent. About 8 s (the first scrape comes ~5 s after start), so not marked slow.
Skips, naming scripts/install_prometheus.sh, where prometheus is not installed.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import time
from typing import Callable, Iterator

import pytest

from service import free_port
from prometheus_server import (PrometheusError, PrometheusServer, PrometheusUnavailable,
                               prometheus_servers)

prometheus_client = pytest.importorskip(
    "prometheus_client", reason="prometheus-client (scripts/install.sh) serves the test target")

COUNTER = "crossover_helper_test_ticks"


@pytest.fixture
def prometheus_factory(tmp_path: pathlib.Path) -> Iterator[Callable[..., PrometheusServer]]:
    yield from prometheus_servers(tmp_path)


@pytest.fixture
def ticks() -> Iterator[tuple[str, object]]:
    """A prometheus_client server on 127.0.0.1 (a free port) with one counter; yields its
    target ("127.0.0.1:PORT") and the counter."""
    registry = prometheus_client.CollectorRegistry()
    counter = prometheus_client.Counter(COUNTER, "Ticks the test counted.", ["side"],
                                        registry=registry)
    server, thread = prometheus_client.start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield f"127.0.0.1:{server.server_port}", counter
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_prometheus_scrapes_a_counter_and_answers_queries(prometheus_factory, ticks) -> None:
    target, counter = ticks
    dead = f"127.0.0.1:{free_port()}"  # nobody serves it
    counter.labels(side="a").inc(7)
    started = time.monotonic()
    prom = prometheus_factory([target, dead], scrape_interval_s=1.0)
    assert prom.running and prom.url.startswith("http://127.0.0.1:")
    query = f'{COUNTER}_total{{job="crossover",side="a"}}'
    prom.wait_for(f"{query} == 7", timeout_s=30)
    first_s = time.monotonic() - started
    assert prom.query_value(query) == 7.0
    assert prom.query_value(f'up{{instance="{target}"}}') == 1.0
    by_instance = {t["labels"]["instance"]: t for t in prom.targets()}
    assert set(by_instance) == {target, dead}, by_instance
    live = by_instance[target]
    assert live["health"] == "up" and live["labels"]["job"] == "crossover", live
    assert live["scrapeUrl"] == f"http://{target}/metrics", live
    # Scraped again and again: a later increment shows up.
    counter.labels(side="a").inc(5)
    prom.wait_for(f"{query} == 12", timeout_s=20)
    (series,) = prom.query(query)
    assert series["metric"]["instance"] == target and series["value"][1] == "12", series
    samples = prom.query(f"count_over_time({query}[1m])")
    assert float(samples[0]["value"][1]) >= 2, samples  # at least two scrapes stored
    end = time.time()
    (ranged,) = prom.query_range(query, start=end - 60, end=end, step_s=1)
    assert {v for _, v in ranged["values"]} >= {"7", "12"}, ranged["values"]
    assert prom.query("scalar(vector(3))") == [
        {"metric": {}, "value": [pytest.approx(end, abs=60), "3"]}]
    with pytest.raises(PrometheusError, match="bad_data"):
        prom.query("sum(")
    # The dead target: down, and a wait for every target up times out saying why.
    prom.wait_for(lambda: prom.query_value(f'up{{instance="{dead}"}}') == 0.0, timeout_s=10)
    with pytest.raises(TimeoutError, match="connection refused") as info:
        prom.wait_for_targets_up(timeout_s=1)
    assert f"every target up ({target}, {dead})" in str(info.value), info.value
    print(f"first answer {first_s:.1f} s after start, done {time.monotonic() - started:.1f} s")
    pid = prom.proc.pid
    prom.stop()
    prom.stop()  # idempotent
    assert not prom.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_failed_start_raises_with_prometheus_error_and_no_hang(tmp_path) -> None:
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not on PATH (scripts/install_prometheus.sh installs it)")
    started = time.monotonic()
    server = PrometheusServer(["127.0.0.1:1"], base_dir=tmp_path,
                              extra_args=["--no-such-flag"])
    with pytest.raises(PrometheusError, match="exited .* before it was ready") as info:
        with server:
            pass
    assert "no-such-flag" in str(info.value), info.value  # the log's tail says why
    assert time.monotonic() - started < 20
    assert not server.running


def test_no_prometheus_binary_is_unavailable_naming_the_install_script(tmp_path) -> None:
    server = PrometheusServer(["127.0.0.1:1"], base_dir=tmp_path,
                              binary=str(tmp_path / "no-prometheus"))
    with pytest.raises(PrometheusUnavailable, match="scripts/install_prometheus.sh"):
        server.start()
    server.stop()
