"""The benchmarks of docs/experiments.md run, in their `--short` mode, and print their figure.

Why: no test ran them, and one (strategy_overhead) rotted unseen until a user tried it (issue
38). Each test runs the documented command with `--short` and checks that the figure it prints
lies within bounds that only a broken run leaves (no hand-off, two holders at once, a lone job
waiting for a peer), never bounds a slow or busy machine could miss: the figures themselves
come from the full runs (docs/experiments.md, "Benchmarks"), never from a timed test.
"""
from __future__ import annotations

import pathlib
import re
import sys

import pytest

from conftest import REPO_ROOT, run_bounded

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
TIMEOUT_S = 180  # a short run takes seconds after TensorFlow's start; a hang fails, not waits
_NUMBER = r"(-?\d+(?:\.\d+)?)"


def run_benchmark(name: str, env: dict[str, str], lease_dir: pathlib.Path,
                  *flags: str) -> str:
    """`python -m benchmarks.<name> --short [flags]` from the repository root, on a lease
    directory of its own; fails unless it exits 0. Returns its output."""
    env = {**env, "CROSSOVER_LEASE_DIR": str(lease_dir)}
    result = run_bounded([sys.executable, "-m", f"benchmarks.{name}", "--short", *flags], env,
                         TIMEOUT_S, cwd=str(REPO_ROOT))
    assert result.returncode == 0, f"benchmarks.{name} exited {result.returncode}:\n" \
                                   f"{result.stdout[-4000:]}"
    return result.stdout


def figures(pattern: str, output: str) -> list[tuple[float, ...]]:
    """Every match of pattern (its groups numbers) in output, as floats; fails on none."""
    found = [tuple(map(float, m)) if isinstance(m, tuple) else (float(m),)
             for m in re.findall(pattern, output, flags=re.M)]
    assert found, f"no line matches {pattern!r}:\n{output[-4000:]}"
    return found


def test_lease_handoff_prints_each_rounds_latency_and_their_spread(child_env, tmp_path):
    """Two rounds of two processes handing the lease back and forth: each round saw
    hand-offs (the peer waited on a held lease) taking less than a hold, and the summary gives
    the rounds' spread."""
    output = run_benchmark("lease_handoff", child_env, tmp_path)
    rounds = figures(rf"^round \d+: (\d+) hand-offs, median {_NUMBER} us, p99 {_NUMBER} us",
                     output)
    assert len(rounds) == 2, output
    for handoffs, median_us, p99_us in rounds:
        # Of 79 possible in 40 cycles (67-77 seen): a queued peer got most of the releases.
        assert handoffs >= 20, rounds
        assert 0 < median_us <= p99_us < 1e6, rounds  # 1 s would be a lost wake-up
    assert "over 2 rounds, median [min–max]" in output and "p99 spread" in output
    (pair_us,) = figures(rf"tf\.function: {_NUMBER} us", output)[0]
    assert 0 < pair_us < 10_000, output


def test_lease_handoff_beside_the_scraped_exporter_prints_the_ratio(child_env, tmp_path):
    """--scrape_hz: each round again beside the node exporter scraped at that rate; the
    exporter really was scraped, and the ratio line follows the scraped rounds."""
    output = run_benchmark("lease_handoff", child_env, tmp_path, "--scrape_hz", "20")
    ((scrapes,),) = figures(r"scraped at 20 Hz \((\d+) scrapes\)", output)
    assert scrapes > 0, output
    assert len(figures(r"^round \d+: (\d+) hand-offs", output)) == 4, output
    median, p99 = figures(rf"median {_NUMBER} \[[^]]*\], p99 {_NUMBER} \[", output.split(
        "scraped / not scraped")[1])[0]
    assert 0 < median and 0 < p99, output


def test_strategy_overhead_runs_a_lone_job_and_prints_the_ratio(child_env, tmp_path):
    """A lone crossover job (group of one) beside the same strategy with no group and Keras
    alone: it starts without waiting for a peer (the failure of issue 38), every variant
    trains, its step is within 2x of plain's, and the single steps interleaved through
    train_on_batch took the lease (the per-pair difference is printed)."""
    output = run_benchmark("strategy_overhead", child_env, tmp_path)
    ((ratio,),) = figures(rf"crossover / plain {_NUMBER}$", output)
    assert 0.5 < ratio < 2.0, output
    for variant in ("keras", "plain", "crossover"):
        assert f"  {variant} rounds (ms): " in output, output
    assert "crossover / plain per round (the lease)" in output, output
    ((plain, crossed),) = figures(rf"train_on_batch\): plain {_NUMBER} ms, crossover {_NUMBER} ms",
                                  output)
    assert plain > 0 and crossed > 0, output
    ((acquires,),) = figures(rf"acquired the lease {_NUMBER} times in the single steps", output)
    assert acquires == 2 * (20 + 1), output  # two holds a step: --short's 20 pairs and a warm-up
    ((read_us,),) = figures(rf"one read of the lease statistics: {_NUMBER} us", output)
    assert 0 < read_us < 5000, output


def test_lease_priority_prints_one_row_per_micro_batch_and_never_two_holders(child_env,
                                                                             tmp_path):
    """Each micro-batch size's row: the primary stepped beside the secondary, the secondary
    got some of the device, and the two never held it at once (overlaps 0)."""
    output = run_benchmark("lease_priority", child_env, tmp_path)
    rows = figures(r"^\| " + r" \| ".join([_NUMBER] * 7) + r" \|$", output)
    assert [row[0] for row in rows] == [1.0, 2.0, 4.0], output
    for _, solo, paired, ratio, max_wait_ms, share, overlaps in rows:
        assert solo > 0 and paired > 0 and 0.3 < ratio < 1.5, output
        assert 0 < share < 1 and overlaps == 0, output
        assert max_wait_ms < 1000, output  # the lease's 10 s timeout never came near


@pytest.mark.netns
def test_allreduce_backends_times_both_backends_on_the_emulated_link(child_env, tmp_path):
    """Issue 33's side by side: a round times Horovod's and TensorFlow's allreduce on the same
    shaped link, each no faster than the link allows, and prints their ratio."""
    from experiments.cluster import shell
    usable, reason = shell.netns_usable()
    if not usable:
        pytest.skip(f"needs root and ip netns: {reason}")
    output = run_benchmark("allreduce_backends", child_env, tmp_path)
    ((link_ms,),) = figures(rf"the link alone: {_NUMBER} ms", output)
    ((horovod_ms, tensorflow_ms, ratio),) = figures(
        rf"^round 0: horovod median {_NUMBER} ms, tensorflow median {_NUMBER} ms, "
        rf"tensorflow / horovod {_NUMBER}$", output)
    assert horovod_ms >= 0.9 * link_ms and tensorflow_ms >= 0.9 * link_ms, output
    assert ratio == pytest.approx(tensorflow_ms / horovod_ms, rel=0.02), output  # ms rounded
    assert "tensorflow / horovod allreduce time over 1 round(s)" in output
