"""The lease core without TensorFlow: its C++ unit tests, and real-process reproductions of
every way two jobs could end up on the device at once (ops/testing/lease_cli.cc drives them).

Each reproduction here failed on the lease core before it was hardened (see the closing note
of issue 9): 307 overlaps in 50 stale-segment races, a lease stolen across PID namespaces
within milliseconds, a SIGSEGV when one of two waiting threads timed out, a forked child
releasing its parent's hold.
"""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import subprocess
import time

import pytest

from conftest import REPO_ROOT

BUILD = REPO_ROOT / "ops" / "build"
UNIT = BUILD / "device_lease_test"
CLI = BUILD / "lease_cli"
OTHER_LAYOUT_CLI = BUILD / "lease_cli_other_layout"  # another segment layout (ops/Makefile)


@pytest.fixture(scope="module", autouse=True)
def core_binaries() -> None:
    """The binaries are built by scripts/install.sh; rebuild if sources are newer."""
    subprocess.run(["make", "-s", "-C", str(REPO_ROOT / "ops"), "tests"], check=True,
                   timeout=300)


def _summary(out: str) -> dict[str, str]:
    """The key=value pairs of lease_cli's last line."""
    last = out.strip().splitlines()[-1]
    return dict(field.split("=", 1) for field in last.split())


def _cli(*args: str, timeout: float = 120) -> dict[str, str]:
    proc = subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"lease_cli {args} exited {proc.returncode}: {proc.stderr}"
    return _summary(proc.stdout)


# ops/README.md's layers: the folders each folder may include from (its own, and below it).
OPS_LAYERS = {"core": {"core"}, "tf": {"core"}, "testing": {"core", "testing"},
              "gpu_probe": {"core", "gpu_probe"}, "launch": set()}


def test_ops_layers() -> None:
    """The core includes nothing outside core/; tf/, testing/ and gpu_probe/ include the core
    and themselves; nothing outside testing/ includes testing/. Every folder of ops/ is a layer."""
    ops = REPO_ROOT / "ops"
    folders = {p.name for p in ops.iterdir() if p.is_dir() and p.name != "build"}
    assert folders == set(OPS_LAYERS), f"ops/ folders {sorted(folders)} are not the layers"
    wrong = []
    for folder, allowed in OPS_LAYERS.items():
        for path in sorted((ops / folder).iterdir()):
            if path.suffix not in (".c", ".cc", ".h", ".cu"):
                continue
            for name in re.findall(r'^#include "([^"]+)"', path.read_text(), re.M):
                top = name.split("/")[0]
                framework = folder == "tf" and top in ("tensorflow", "xla")
                if top not in allowed and not framework:
                    wrong.append(f"ops/{folder}/{path.name} includes {name}")
    assert not wrong, "includes across ops/'s layers:\n" + "\n".join(wrong)


def test_shipped_libraries_hold_no_test_hooks() -> None:
    """The test hooks (ops/testing/lease_test_hooks.cc) are linked into the test binaries only,
    never into the libraries that ship (ops/Makefile `lib`; scripts/bazel_check.sh checks
    Bazel's)."""
    lease = REPO_ROOT / "crossover_tf" / "lease"
    libraries = [lease / name for name in ("_lease_ops.so", "_lease_observer.so")
                 if (lease / name).exists()]
    if not libraries:
        pytest.skip("no built libraries (scripts/install.sh or `make -C ops lib` builds them)")
    assert b"LeaseTestHooks" in UNIT.read_bytes()  # the symbol names would show them
    for library in libraries:
        assert b"LeaseTestHooks" not in library.read_bytes(), f"{library} holds the test hooks"


def _gtest_names(binary: pathlib.Path) -> list[str]:
    """Suite.Name of each test that a GoogleTest binary lists (--gtest_list_tests: a line
    "Suite." and then one indented line per test)."""
    out = subprocess.run([str(binary), "--gtest_list_tests"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    names, suite = [], None
    for line in out.splitlines():
        if line.startswith(" ") and suite:
            names.append(suite + line.split()[0])
        elif line.strip().endswith("."):  # not gtest_main's "Running main() from ..."
            suite = line.strip()
    return names


def test_core_units(subtests: pytest.Subtests) -> None:
    """Each GoogleTest test of the core's binary (ops/testing/device_lease_test.cc), run alone
    as a subtest: listed at run time, after the fixture's make, so that collecting the tests
    builds nothing. A test that GTEST_SKIPs (the root-only ones) is a skipped subtest."""
    names = _gtest_names(UNIT)
    assert names, f"{UNIT} --gtest_list_tests named no tests"
    for name in names:
        with subtests.test(name):
            proc = subprocess.run([str(UNIT), f"--gtest_filter={name}"], capture_output=True,
                                  text=True, timeout=120)
            if proc.returncode == 0 and f"[  SKIPPED ] {name} (" in proc.stdout:
                reason = re.search(r": Skipped\n(.*)", proc.stdout)
                pytest.skip(f"{name}: {reason.group(1) if reason else 'skipped'}")
            assert proc.returncode == 0 and f"[       OK ] {name} (" in proc.stdout, (
                proc.stdout + proc.stderr)


@pytest.mark.multiprocess
def test_concurrent_start_on_stale_segment_shares_one_lease(lease_group: str) -> None:
    result = _cli("stale-race", lease_group, "50")
    assert int(result["acquisitions"]) == 50 * 2 * 20, result
    assert (result["overlaps"], result["errors"], result["timeouts"]) == ("0", "0", "0"), result


@pytest.mark.multiprocess
def test_waiting_thread_survives_sibling_timeout(lease_group: str) -> None:
    result = _cli("thread-timeout", lease_group, timeout=60)
    assert result == {"mode": "thread-timeout", "impatient_timed_out": "1", "patient_ok": "1",
                      "overlaps": "0", "peer_ok": "1"}


@pytest.mark.multiprocess
def test_forked_child_does_not_own_parents_hold(lease_group: str) -> None:
    result = _cli("fork-child", lease_group, timeout=60)
    assert result["child_saw_parent_hold"] == "1" and result["parent_still_holds"] == "1", result


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-Urpf", "--mount-proc", "true"], capture_output=True,
                           timeout=30)
    return probe.returncode == 0


def _wait_for(path: pathlib.Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} not written within {timeout} s"
        time.sleep(0.01)


def _in_own_pid_namespace(*args: str) -> list[str]:
    return ["unshare", "-Urpf", "--mount-proc", str(CLI), *args]


@pytest.mark.multiprocess
@pytest.mark.parametrize("holder_isolated", [True, False], ids=["holder-in-ns", "waiter-in-ns"])
def test_pid_namespaces_do_not_steal_the_lease(tmp_path: pathlib.Path, lease_group: str,
                                               holder_isolated: bool) -> None:
    """Docker --ipc=host / Kubernetes hostIPC: a shared /dev/shm, separate PID namespaces."""
    if not _can_unshare():
        pytest.skip("unshare -Urpf is not permitted here (needs user namespaces)")
    ready = tmp_path / "ready"
    hold = ("hold", lease_group, "dev", str(ready))
    holder = subprocess.Popen(_in_own_pid_namespace(*hold) if holder_isolated
                              else [str(CLI), *hold], start_new_session=True)

    def acquire(timeout_s: str, out: pathlib.Path) -> str:
        args = ("acquire", lease_group, "dev", timeout_s, str(out))
        subprocess.run(_in_own_pid_namespace(*args) if not holder_isolated else [str(CLI), *args],
                       check=True, timeout=60)
        return out.read_text()

    try:
        _wait_for(ready, 30)
        while_alive = acquire("1.5", tmp_path / "while_alive")
        assert while_alive.startswith("error") and "held by pid" in while_alive, while_alive
        assert "another PID namespace" in while_alive, while_alive
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        killed = time.monotonic_ns()
        after_kill = acquire("5", tmp_path / "after_kill")
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()
    assert after_kill.startswith("ok"), after_kill
    # CLOCK_MONOTONIC is shared by both sides (no time namespace is made).
    assert (int(after_kill.split()[1]) - killed) / 1e9 < 1.0, after_kill


def _no_overlaps(intervals: list[tuple[int, int, int]]) -> None:
    ordered = sorted(intervals)
    for (s1, e1, w1), (s2, e2, w2) in zip(ordered, ordered[1:]):
        assert e1 <= s2, f"hold intervals overlap: {(s1, e1, w1)} and {(s2, e2, w2)}"


@pytest.mark.multiprocess
@pytest.mark.parametrize("jobs", [3, 4])
def test_n_jobs_take_turns_in_fifo_order(tmp_path: pathlib.Path, lease_group: str,
                                         jobs: int) -> None:
    outs = [tmp_path / f"job{j}.txt" for j in range(jobs)]
    procs = [subprocess.Popen([str(CLI), "cycles", lease_group, "dev", "60", "2000", str(out),
                               str(tmp_path / "barrier"), str(jobs)]) for out in outs]
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    holds = [(int(s), int(e), j) for j, out in enumerate(outs)
             for s, e in (line.split() for line in out.read_text().splitlines())]
    _no_overlaps(holds)
    # While all jobs cycle, FIFO means every run of `jobs` consecutive holds has each job once.
    both_start = max(min(s for s, _, w in holds if w == j) for j in range(jobs))
    both_end = min(max(e for _, e, w in holds if w == j) for j in range(jobs))
    owners = [w for s, e, w in sorted(holds) if s >= both_start and e <= both_end]
    assert len(owners) >= 30 * jobs, owners
    windows = [owners[i:i + jobs] for i in range(len(owners) - jobs + 1)]
    rotating = sum(len(set(window)) == jobs for window in windows)
    assert rotating >= 0.9 * len(windows), f"not FIFO: {owners}"
    shares = [owners.count(j) / len(owners) for j in range(jobs)]
    assert max(shares) <= 1.2 * min(shares), f"starvation: shares {shares}"


@pytest.mark.multiprocess
@pytest.mark.slow
def test_stress_random_sigkills(lease_group: str) -> None:
    """4 workers, 20 s, a random one SIGKILLed (and replaced) every 50-300 ms."""
    result = _cli("stress", lease_group, "20", "4", timeout=90)
    print(result)
    for key in ("overlaps", "timeouts", "errors", "failures", "hangs"):
        assert result[key] == "0", result
    assert int(result["kills"]) >= 30 and int(result["acquisitions"]) >= 1000, result


@pytest.mark.multiprocess
def test_primary_is_never_queued_behind_a_secondary(lease_group: str) -> None:
    """A primary stepping beside a secondary that computes in 2 ms micro-batches: nobody is on
    the device twice, the secondary fills the primary's allreduce gaps, and the primary waits
    at most about one micro-batch (speed ratios: benchmarks/lease_priority.py)."""
    result = _cli("priority", lease_group, "2", "2000", timeout=60)
    assert result["overlaps"] == "0", result
    assert int(result["secondary_holds"]) > 100, result
    assert int(result["max_wait_us"]) < 2000 + 50_000, result  # one micro-batch + scheduling


@pytest.mark.multiprocess
def test_killing_one_of_three_jobs_leaves_the_others_running(tmp_path: pathlib.Path,
                                                             lease_group: str) -> None:
    outs = [tmp_path / f"job{j}.txt" for j in range(3)]
    procs = [subprocess.Popen([str(CLI), "cycles", lease_group, "dev", "150", "3000", str(out),
                               str(tmp_path / "barrier"), "3"]) for out in outs]
    try:
        deadline = time.monotonic() + 60
        while not all(out.exists() and out.read_text().count("\n") >= 5 for out in outs):
            assert time.monotonic() < deadline, "jobs did not start cycling"
            time.sleep(0.02)
        procs[1].kill()  # SIGKILL, possibly while it holds the device
        assert procs[0].wait(timeout=120) == 0 and procs[2].wait(timeout=120) == 0
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    survivors = [(int(s), int(e), j) for j in (0, 2)
                 for s, e in (line.split() for line in outs[j].read_text().splitlines())]
    assert len(survivors) == 2 * 150
    _no_overlaps(survivors)


_LAYOUTS = re.compile(r"found (\d+) bytes, magic 0x[0-9a-f]+, layout version (\d+); "
                      r"this build expects (\d+) bytes, magic 0x[0-9a-f]+, layout version (\d+)")


def _acquire_with(cli: pathlib.Path, group: str, timeout_s: str,
                  out: pathlib.Path) -> tuple[subprocess.CompletedProcess, str]:
    """One `lease_cli acquire` of `cli`'s build: the process, and what it wrote (empty if it
    never got as far as acquiring)."""
    proc = subprocess.run([str(cli), "acquire", group, "dev", timeout_s, str(out)],
                          capture_output=True, text=True, timeout=60)
    return proc, out.read_text() if out.exists() else ""


@pytest.mark.multiprocess
@pytest.mark.parametrize("first,second", [(CLI, OTHER_LAYOUT_CLI), (OTHER_LAYOUT_CLI, CLI)],
                         ids=["current-holds", "other-layout-holds"])
def test_other_layout_is_refused_while_in_use(tmp_path: pathlib.Path, lease_group: str,
                                              first: pathlib.Path, second: pathlib.Path) -> None:
    """Jobs of two builds with different segment layouts on one device: the second build must
    not replace the segment the first still uses (each would then hold its own lease), but
    may take it over once the first is gone."""
    ready = tmp_path / "ready"
    holder = subprocess.Popen([str(first), "hold", lease_group, "dev", str(ready)],
                              start_new_session=True)
    try:
        _wait_for(ready, 30)
        refused, refused_out = _acquire_with(second, lease_group, "1", tmp_path / "refused")
        _, same_build = _acquire_with(first, lease_group, "0.5", tmp_path / "same_build")
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        taken, taken_out = _acquire_with(second, lease_group, "5", tmp_path / "taken")
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()
    assert refused.returncode == 2 and not refused_out, (
        f"the other build got past the live segment: {refused_out!r} {refused.stderr}")
    layouts = _LAYOUTS.search(refused.stderr)
    assert layouts and "in use" in refused.stderr, refused.stderr
    found_size, found_version, own_size, own_version = map(int, layouts.groups())
    assert abs(found_version - own_version) == 1000, layouts  # the other build: +1000
    assert abs(found_size - own_size) == 64, layouts
    assert same_build.startswith("error") and f"held by pid {holder.pid}" in same_build, (
        f"the first build's holder lost the lease: {same_build!r}")
    assert taken.returncode == 0 and taken_out.startswith("ok"), (taken_out, taken.stderr)
    assert "replacing" in taken.stderr and "nobody uses it" in taken.stderr, taken.stderr
