"""Tests of the emulated cluster launcher: namespaces really appear and disappear, links are really
shaped, Horovod-over-Gloo jobs really run across namespaces (alone, in pairs, failing), and the
localhost fallback works. Namespace tests need root and `ip netns`; they skip with the reason."""
from __future__ import annotations

import ipaddress
import json
import pathlib
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from experiments.cluster import cleanup, linkprobe, naming, shell, subnets
from experiments.cluster.launch import launch_job, wait_jobs
from experiments.cluster.netns import EmulatedCluster
from experiments import launch_pair
from conftest import REPO_ROOT

BENCHMARK_NET = ipaddress.ip_network("198.18.0.0/15")
SHAPED_MBIT = 50.0
JOB_TIMEOUT_S = 60.0
TEST_TIMEOUT_S = 90

NETNS_OK, NETNS_REASON = shell.netns_usable()


def netns_test(test):
    """Marks a test `netns` and `slow` (it builds namespaces), and skips it, with the reason,
    where namespaces cannot be made."""
    skip = pytest.mark.skipif(not NETNS_OK, reason=f"needs root and ip netns: {NETNS_REASON}")
    return pytest.mark.slow(pytest.mark.netns(skip(test)))


# One Horovod rank: exits 3 at once if it is $FAIL_RANK, else allreduces rank+1 over the world.
RANK_SCRIPT = textwrap.dedent("""
    import os, socket, sys
    if os.environ.get("FAIL_RANK") == os.environ["HOROVOD_RANK"]:
        sys.exit(3)
    import tensorflow as tf
    import horovod.tensorflow as hvd
    hvd.init()
    total = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum)
    print(f"RESULT rank={hvd.rank()} size={hvd.size()} sum={float(total.numpy()[0]):g} "
          f"key={os.environ['CROSSOVER_DEVICE_KEY']} "
          f"addr={socket.gethostbyname(socket.gethostname())}", flush=True)
""")
# The same rank through TensorFlow's collectives (issue 33): its cluster from TF_CONFIG.
TF_RANK_SCRIPT = textwrap.dedent("""
    import json, os, socket, sys
    sys.path.insert(0, os.environ["CROSSOVER_REPO"])
    from crossover_tf._communication.tensorflow import TensorFlowCommunicator
    comm = TensorFlowCommunicator(timeout_s=30)
    comm.start()
    import tensorflow as tf
    (total,) = comm.allreduce([tf.constant([float(comm.rank + 1)])], mean=False, name="sum")
    address = json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][comm.rank]
    print(f"RESULT rank={comm.rank} size={comm.size} sum={float(total.numpy()[0]):g} "
          f"key={os.environ['CROSSOVER_DEVICE_KEY']} addr={address.rsplit(':', 1)[0]}",
          flush=True)
""")
RESULT_RE = re.compile(r"RESULT rank=(\d+) size=(\d+) sum=(\S+) key=(\S+) addr=(\S+)")


@pytest.fixture(autouse=True)
def hard_timeout():
    """Fails (instead of hanging) any test that runs past TEST_TIMEOUT_S."""
    def expire(signum, frame):
        raise TimeoutError(f"test exceeded {TEST_TIMEOUT_S}s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TEST_TIMEOUT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def rank_script(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("ranks") / "allreduce.py"
    path.write_text(RANK_SCRIPT)
    return str(path)


@pytest.fixture(scope="module")
def shaped_cluster():
    """A 2-host cluster with 50 Mbit/s links, shared by the job tests to save set-up time."""
    if not NETNS_OK:
        pytest.skip(f"needs root and ip netns: {NETNS_REASON}")
    with EmulatedCluster(num_hosts=2, bandwidth_mbit=SHAPED_MBIT) as cluster:
        yield cluster


def names_with(prefix: str) -> list[str]:
    """Every namespace, link and /etc/netns entry of a cluster prefix still on the machine."""
    names = cleanup.list_namespaces() + cleanup.list_links()
    names += [p.name for p in cleanup.list_netns_etc_dirs()]
    return [n for n in names if naming.owner_of(n) == prefix]


def rank_results(job: dict) -> list[tuple[int, int, float, str, str]]:
    """The RESULT line of each rank's log, parsed."""
    found = []
    for log in job["logs"]:
        match = RESULT_RE.search(pathlib.Path(log).read_text())
        assert match, f"no RESULT in {log}:\n{pathlib.Path(log).read_text()[-2000:]}"
        rank, size, total, key, addr = match.groups()
        found.append((int(rank), int(size), float(total), key, addr))
    return found


def assert_allreduce_ok(job: dict, cluster: EmulatedCluster) -> None:
    assert job["ok"], job
    assert job["exit_codes"] == [0, 0]
    for rank, (got_rank, size, total, key, addr) in enumerate(rank_results(job)):
        host = cluster.hosts[rank]
        assert (got_rank, size, total, key) == (rank, 2, 3.0, host.name)
        assert addr == host.address  # Gloo resolves the hostname to this host's own address


def ipv4_addrs(*ip_prefix: str) -> list[str]:
    out = subprocess.run([*ip_prefix, "-4", "-o", "addr", "show"], capture_output=True,
                         text=True, timeout=10, check=True).stdout
    return re.findall(r"^\d+:\s+(\S+)\s+inet\s+(\S+)", out, re.M)


@netns_test
def test_cluster_created_connected_and_fully_removed():
    with EmulatedCluster(num_hosts=2) as cluster:
        prefix = cluster.prefix
        assert cluster.is_emulated
        namespaces = [n for n in cleanup.list_namespaces() if naming.owner_of(n) == prefix]
        assert sorted(namespaces) == [f"{prefix}h0", f"{prefix}h1"]
        bridge_addrs = [a for dev, a in ipv4_addrs("ip") if dev == naming.bridge_name(prefix)]
        network = cluster.subnet.network
        assert network.subnet_of(BENCHMARK_NET) and network.prefixlen == 24
        assert bridge_addrs == [f"{network[254]}/24"] == [f"{cluster.rendezvous_address}/24"]
        assert cluster.describe()["subnet"] == str(network)
        for i, host in enumerate(cluster.hosts):
            addrs = dict(ipv4_addrs("ip", "-n", host.namespace))
            assert addrs == {"lo": "127.0.0.1/8", "eth0": f"{network[i + 1]}/24"}
            assert host.address == str(network[i + 1])
        for src, dst in ((0, 1), (1, 0)):  # a TCP connection each way, host to host
            received, _ = linkprobe.transfer(cluster, cluster.hosts[src], cluster.hosts[dst],
                                             nbytes=65536, timeout_s=15)
            assert received == 65536
        assert (cleanup.OWNER_DIR / f"{prefix}.json").exists()
    assert names_with(prefix) == []
    assert not (cleanup.OWNER_DIR / f"{prefix}.json").exists()


# Connects to argv[1]:argv[2], sends "ping", prints what comes back (the rendezvous path).
DIAL = "import socket, sys; s = socket.create_connection((sys.argv[1], int(sys.argv[2])), " \
    "timeout=3); s.sendall(b'ping'); print(s.recv(4).decode())"


def reaches_launcher(cluster: EmulatedCluster, host) -> bool:
    """Whether `host` gets a TCP answer from the launcher's side of the bridge, where the Gloo
    rendezvous server listens (the path that broke when two clusters shared one subnet)."""
    with socket.create_server((cluster.rendezvous_address, 0)) as server:
        server.settimeout(5)
        dial = subprocess.Popen(cluster.exec_prefix(host) + [
            sys.executable, "-c", DIAL, cluster.rendezvous_address,
            str(server.getsockname()[1])], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        try:
            conn, _ = server.accept()
            with conn:
                conn.sendall(conn.recv(4))
            out, _ = dial.communicate(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return False
        finally:
            if dial.poll() is None:
                dial.kill()
                dial.wait(timeout=5)
    return out.strip() == "ping"


@netns_test
def test_two_clusters_at_once_get_their_own_subnets():
    """Two launchers on one machine (two comparisons, or a test beside a benchmark): each
    cluster's hosts must reach each other and its own bridge. With one shared 198.18.0.0/24 the
    second cluster's packets left by the first one's bridge and its jobs hung until timeout."""
    with EmulatedCluster(num_hosts=2) as first, EmulatedCluster(num_hosts=2) as second:
        networks = []
        for cluster in (first, second):
            bridge_addrs = [a for dev, a in ipv4_addrs("ip")
                            if dev == naming.bridge_name(cluster.prefix)]
            assert bridge_addrs == [f"{cluster.rendezvous_address}/24"]
            network = ipaddress.ip_interface(bridge_addrs[0]).network
            assert network.subnet_of(BENCHMARK_NET)
            assert all(ipaddress.ip_address(h.address) in network for h in cluster.hosts)
            networks.append(network)
        assert not networks[0].overlaps(networks[1])
        for cluster in (second, first):
            h0, h1 = cluster.hosts
            received, _ = linkprobe.transfer(cluster, h1, h0, nbytes=65536, timeout_s=10)
            assert received == 65536
            for host in cluster.hosts:
                assert reaches_launcher(cluster, host)


@netns_test
def test_bandwidth_is_limited_in_both_directions(shaped_cluster):
    h0, h1 = shaped_cluster.hosts
    for src, dst in ((h0, h1), (h1, h0)):
        mbit = linkprobe.measure_mbit(shaped_cluster, src, dst, nbytes=4 << 20, timeout_s=20)
        assert 0.7 * SHAPED_MBIT <= mbit <= 1.3 * SHAPED_MBIT, (src.name, dst.name, mbit)


@netns_test
@pytest.mark.multiprocess
def test_horovod_gloo_job_across_namespaces(shaped_cluster, rank_script, tmp_path):
    job = launch_job(shaped_cluster, [sys.executable, rank_script], job_name="solo", env={},
                     log_dir=tmp_path, timeout_s=JOB_TIMEOUT_S)
    result = wait_jobs([job])["solo"]
    assert_allreduce_ok(result, shaped_cluster)
    assert result["logs"] == [str(tmp_path / "solo" / f"rank{k}.log") for k in range(2)]


@netns_test
@pytest.mark.multiprocess
def test_tensorflow_collectives_job_across_namespaces(shaped_cluster, tmp_path):
    """--backend=tensorflow on the emulated cluster: each rank's TF_CONFIG names the hosts'
    addresses, and the allreduce crosses the shaped link between the namespaces."""
    script = tmp_path / "tf_allreduce.py"
    script.write_text(TF_RANK_SCRIPT)
    job = launch_job(shaped_cluster, [sys.executable, str(script)], job_name="tf",
                     env={"CROSSOVER_REPO": str(REPO_ROOT)}, log_dir=tmp_path,
                     timeout_s=JOB_TIMEOUT_S, backend="tensorflow")
    assert job.rendezvous is None
    assert_allreduce_ok(wait_jobs([job])["tf"], shaped_cluster)


@netns_test
@pytest.mark.multiprocess
def test_two_jobs_concurrently_on_same_hosts(shaped_cluster, rank_script, tmp_path):
    jobs = [launch_job(shaped_cluster, [sys.executable, rank_script], job_name=name, env={},
                       log_dir=tmp_path, timeout_s=JOB_TIMEOUT_S) for name in ("A", "B")]
    assert jobs[0].rendezvous is not jobs[1].rendezvous
    results = wait_jobs(jobs)
    for name in ("A", "B"):
        assert_allreduce_ok(results[name], shaped_cluster)


@netns_test
@pytest.mark.multiprocess
def test_failed_rank_ends_job_and_is_reported(shaped_cluster, rank_script, tmp_path):
    started = time.monotonic()
    job = launch_job(shaped_cluster, [sys.executable, rank_script], job_name="bad",
                     env={"FAIL_RANK": "1"}, log_dir=tmp_path, timeout_s=JOB_TIMEOUT_S)
    result = wait_jobs([job])["bad"]
    assert time.monotonic() - started < 20  # not the 60 s job timeout nor Gloo's 30 s timeout
    assert not result["ok"] and not result["timed_out"]
    assert (result["failed_rank"], result["failed_exit_code"]) == (1, 3)
    assert result["terminated_ranks"] == [0]
    assert result["exit_codes"][0] != 0
    assert "rank 1 on host1" in result["failed_log_tail"]
    assert all(r.process.poll() is not None for r in job.ranks)


# A child that builds a cluster, reports its prefix, then waits to be signalled.
CHILD = textwrap.dedent("""
    import sys, time
    from experiments.cluster.netns import EmulatedCluster
    with EmulatedCluster(num_hosts=2) as cluster:
        print(cluster.prefix, flush=True)
        time.sleep(60)
""")


def start_cluster_child() -> tuple[subprocess.Popen, str]:
    child = subprocess.Popen([sys.executable, "-c", CHILD], cwd=REPO_ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    prefix = child.stdout.readline().strip()
    assert prefix and names_with(prefix), child.stderr.read() if child.poll() is not None else ""
    return child, prefix


@netns_test
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_removes_cluster(signum):
    child, prefix = start_cluster_child()
    child.send_signal(signum)
    child.wait(timeout=20)
    assert names_with(prefix) == []


@netns_test
def test_cleanup_stale_removes_leftovers_of_killed_launcher():
    child, prefix = start_cluster_child()
    child.kill()  # SIGKILL: no cleanup of its own can run
    child.wait(timeout=10)
    assert names_with(prefix)
    removed = cleanup.cleanup_stale()
    assert f"{prefix}h0" in removed
    assert names_with(prefix) == []


@pytest.mark.multiprocess
@pytest.mark.slow
def test_localhost_fallback_runs_pair_and_warns(rank_script, tmp_path, capsys):
    result = launch_pair.run(overrides={
        "job_a": f"python {rank_script}", "job_b": f"python {rank_script}", "mode": "concurrent",
        "force_localhost": True, "log_dir": str(tmp_path), "timeout_s": JOB_TIMEOUT_S})
    assert "NOT EMULATING A NETWORK" in capsys.readouterr().err
    assert result["ok"] and not result["cluster"]["emulated"]
    for name in ("A", "B"):
        for rank, (got_rank, size, total, key, _) in enumerate(rank_results(result["jobs"][name])):
            assert (got_rank, size, total, key) == (rank, 2, 3.0, f"host{rank}")
        assert result["jobs"][name]["logs"][0] == str(tmp_path / name / "rank0.log")


def test_job_past_its_timeout_is_killed(tmp_path):
    with EmulatedCluster(num_hosts=2, force_localhost=True) as cluster:
        job = launch_job(cluster, ["sleep", "30"], job_name="slow", env={}, log_dir=tmp_path,
                         timeout_s=1.0)
        result = wait_jobs([job])["slow"]
    assert result["timed_out"] and not result["ok"]
    assert result["terminated_ranks"] == [0, 1]
    assert result["exit_codes"] == [-signal.SIGTERM, -signal.SIGTERM]
    assert result["wall_s"] < 10
    with pytest.raises(RuntimeError, match=r"probe: job slow failed \(rank .*timed out True"):
        launch_pair.raise_on_failure({"slow": result}, "probe")
    launch_pair.raise_on_failure({}, "nothing ran")  # no failure, no error


def _cycle_times(tmp_path: pathlib.Path, monkeypatch, exported: str | None,
                 extra: dict[str, str], **cluster_kwargs) -> list[str]:
    """HOROVOD_CYCLE_TIME as each rank of a localhost cluster saw it."""
    if exported is None:
        monkeypatch.delenv("HOROVOD_CYCLE_TIME", raising=False)
    else:
        monkeypatch.setenv("HOROVOD_CYCLE_TIME", exported)
    with EmulatedCluster(num_hosts=2, force_localhost=True, **cluster_kwargs) as cluster:
        job = launch_job(cluster, ["sh", "-c", 'echo "cycle=[${HOROVOD_CYCLE_TIME-unset}]"'],
                         job_name="env", env=extra, log_dir=tmp_path, timeout_s=JOB_TIMEOUT_S)
        result = wait_jobs([job])["env"]
    assert result["ok"], result
    return [re.search(r"^cycle=\[(.*)\]$", pathlib.Path(log).read_text(), re.M).group(1)
            for log in result["logs"]]


def test_ranks_poll_every_10_ms_unless_the_caller_says_otherwise(tmp_path, monkeypatch):
    """A waiting Horovod rank's polling is device time on an emulated host (netns's
    DEFAULT_CYCLE_TIME_MS): every rank gets 10 ms; the caller's environment, a launch's own env
    and a cluster without the default (a GPU's) keep theirs."""
    assert _cycle_times(tmp_path / "default", monkeypatch, None, {}) == ["10", "10"]
    assert _cycle_times(tmp_path / "exported", monkeypatch, "1", {}) == ["1", "1"]
    assert _cycle_times(tmp_path / "launch", monkeypatch, None,
                        {"HOROVOD_CYCLE_TIME": "5"}) == ["5", "5"]
    assert _cycle_times(tmp_path / "gpu", monkeypatch, None, {},
                        horovod_cycle_time_ms=None) == ["unset", "unset"]
    with EmulatedCluster(num_hosts=2, force_localhost=True) as cluster:
        assert cluster.describe()["horovod_cycle_time_ms"] == 10.0
    with pytest.raises(ValueError, match="horovod_cycle_time_ms must be positive"):
        EmulatedCluster(num_hosts=2, horovod_cycle_time_ms=0)


def test_cluster_exit_removes_lease_segments_of_its_groups(lease_group):
    segments = [pathlib.Path(f"/dev/shm/crossover.{lease_group}.host{i}") for i in range(2)]
    other = pathlib.Path(f"/dev/shm/crossover.{lease_group}x.host0")  # another group: kept
    for seg in segments + [other]:
        seg.write_bytes(b"\0")
    try:
        with EmulatedCluster(num_hosts=2, force_localhost=True, lease_groups=[lease_group]):
            assert all(seg.exists() for seg in segments)
        assert not any(seg.exists() for seg in segments)
        assert other.exists()
    finally:
        other.unlink(missing_ok=True)
    with pytest.raises(ValueError):
        EmulatedCluster(lease_groups=["../etc"])


def test_without_root_falls_back_to_localhost(monkeypatch, capsys):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with EmulatedCluster(num_hosts=2, bandwidth_mbit=SHAPED_MBIT) as cluster:
        assert not cluster.is_emulated and cluster.fallback_reason == "not running as root"
        assert [(h.address, h.iface, h.namespace) for h in cluster.hosts] == \
            [("127.0.0.1", "lo", None)] * 2
        assert cluster.rendezvous_address == "127.0.0.1"
        assert cluster.exec_prefix(cluster.hosts[1])[:1] != ["ip"]
    assert "NO bandwidth/latency limits" in capsys.readouterr().err



def test_each_cluster_takes_the_lowest_subnet_nothing_overlaps():
    net = ipaddress.ip_network
    assert subnets.first_free([]).network == net("198.18.0.0/24")
    in_use = [net("192.0.2.0/24"), net("198.18.0.0/24"), net("198.18.1.128/25")]
    subnet = subnets.first_free(in_use)
    assert subnet.network == net("198.18.2.0/24")
    assert (subnet.bridge_address, subnet.host_address(0), subnet.host_address(1)) == \
        ("198.18.2.254", "198.18.2.1", "198.18.2.2")
    with pytest.raises(ValueError, match="out of range"):
        subnet.host_address(253)  # would be the bridge's .254
    assert subnets.first_free([net("198.18.0.0/16")]).network == net("198.19.0.0/24")
    with pytest.raises(RuntimeError, match="every /24 of 198.18.0.0/15 is in use"):
        subnets.first_free([net("198.16.0.0/12")])


def test_subnet_lock_held_elsewhere_is_a_clear_error_not_a_hang(tmp_path, monkeypatch):
    monkeypatch.setattr(subnets, "LOCK_PATH", tmp_path / "subnets.lock")
    with subnets.claim_lock():
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="held .*subnets.lock for over 0 s"):
            with subnets.claim_lock(timeout_s=0.3):
                pass
        assert 0.3 <= time.monotonic() - started < 5
    with subnets.claim_lock(timeout_s=0.3):  # released: free again at once
        pass


@netns_test
def test_subnets_in_use_include_a_cluster_bridge():
    with EmulatedCluster(num_hosts=1) as cluster:
        assert cluster.subnet.network in subnets.networks_in_use()
    assert cluster.subnet is None


@netns_test
@pytest.mark.multiprocess
def test_train_pair_crosses_with_tensorflow_collectives_across_namespaces(lease_group,
                                                                          tmp_path):
    """launch_pair --backend=tensorflow with train.py --backend=tensorflow (issue 33): two
    two-rank jobs, each rank's TF_CONFIG naming the emulated hosts, cross on each host."""
    from experiments.cluster.launch import tf_config_port
    assert tf_config_port("A") != tf_config_port("B")  # two jobs' servers on one host
    job = (f"python -m experiments.train --backend=tensorflow --group={lease_group} "
           f"--group_jobs=2 --model=mlp --dataset=synthetic:mnist --steps=30 --warmup_steps=5 "
           f"--global_batch_size=32 --model_dir={tmp_path / 'model'}")
    result = launch_pair.run(overrides={
        "job_a": f"{job} --job=A", "job_b": f"{job} --job=B", "mode": "concurrent",
        "backend": "tensorflow", "bandwidth_mbit": SHAPED_MBIT, "log_dir": str(tmp_path),
        "timeout_s": JOB_TIMEOUT_S})
    assert result["ok"], result
    for name in ("A", "B"):
        stats = json.loads((tmp_path / "model" / name / "stats.json").read_text())
        assert stats["size"] == 2 and stats["lease"]["acquires"] == 2 * 30, stats["lease"]
        assert stats["lease"]["handoffs"] > 0, stats["lease"]
