"""experiments.gpu_pair's commands and launch, without a GPU: which train.py command each
job of each scenario gets, and that the shared launcher starts them on this one host with the
lease key left to the runtime (the real run is tests/multiprocess/test_devices.py's, slow, and
scripts/gpu_check.sh's, SKIPPED without a GPU)."""
from __future__ import annotations

import os
import pathlib

import pytest
from absl import flags
from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.gloo_run import create_slot_env_vars

from crossover_tf._setup.devices import DEVICE_KEY_ENV
from experiments import config as config_lib
from experiments import gpu_pair, launch_pair
from experiments.cluster.launch import rank_env
from experiments.cluster.netns import Host


def settings(**overrides) -> object:
    """gpu_pair's resolved settings (its defaults, then `overrides`)."""
    fresh = flags.FlagValues()
    gpu_pair.define_flags(fresh)
    return config_lib.resolve(fresh, gpu_pair.FLAG_NAMES, overrides, gpu_pair.validate,
                              "gpu_pair")


def flag_values(argv: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in argv if a.startswith("--"))


def test_each_scenario_gets_its_jobs_group_and_barrier(tmp_path: pathlib.Path) -> None:
    c = settings(model="small_cnn", steps=30)
    by_name = {name: gpu_pair.scenario_commands(c, name, tmp_path) for name in gpu_pair.SCENARIOS}
    assert {name: sorted(commands) for name, (commands, _) in by_name.items()} == {
        "solo": ["A"], "naive": ["A", "B"], "crossover": ["A", "B"]}
    assert [group for _, group in by_name.values()][:2] == ["", ""]
    assert by_name["crossover"][1].startswith("gp")
    for name, (commands, group) in by_name.items():
        for job, argv in commands.items():
            assert argv[1:3] == ["-m", "experiments.train"]
            values = flag_values(argv)
            assert (values["job"], values.get("group", ""), values["model"], values["steps"]) \
                == (job, group, "small_cnn", "30")
            assert values["model_dir"] == str(tmp_path / name)
            barrier = values.get("start_barrier", "")
            assert barrier == ("" if name == "solo" else f"{tmp_path / 'barriers' / name}:2")


def test_scenario_runs_through_the_shared_launcher_without_a_host_key(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """All jobs together, the key left to the runtime, and the lease group removed even when
    the launch fails."""
    seen, removed = {}, []

    class Stop(Exception):
        pass

    def run_jobs(cluster, commands, *, mode, log_dir, timeout_s, env=None,
                 host_device_key=True):
        seen.update(cluster=cluster, jobs=sorted(commands), mode=mode, log_dir=log_dir,
                    timeout_s=timeout_s, host_device_key=host_device_key)
        raise Stop

    monkeypatch.setattr(launch_pair, "run_jobs", run_jobs)
    monkeypatch.setattr(gpu_pair, "remove_lease_segments", removed.extend)
    c = settings(timeout_s=42.0)
    with pytest.raises(Stop):
        gpu_pair._run_scenario("the cluster", c, "crossover", tmp_path)
    assert seen == {"cluster": "the cluster", "jobs": ["A", "B"], "mode": "concurrent",
                    "log_dir": str(tmp_path / "logs" / "crossover"), "timeout_s": 42.0,
                    "host_device_key": False}
    assert len(removed) == 1 and removed[0].startswith("gp")


def test_this_machine_is_one_localhost_host_on_every_allowed_cpu(capsys) -> None:
    with gpu_pair.this_machine() as cluster:
        assert not cluster.is_emulated
        assert [(h.address, h.cpus) for h in cluster.hosts] == [
            ("127.0.0.1", ",".join(map(str, sorted(os.sched_getaffinity(0)))))]


@pytest.mark.parametrize("host_device_key,inherited,given,expected", [
    (True, "stale", None, "host0"),       # emulated hosts: the host is the device
    (False, "stale", None, None),         # a real device: the runtime's physical key
    (False, None, "mig-a", "mig-a"),      # one the caller asks for still reaches the rank
])
def test_rank_env_sets_the_host_device_key_only_when_asked(
        monkeypatch: pytest.MonkeyPatch, host_device_key: bool, inherited: str | None,
        given: str | None, expected: str | None) -> None:
    if inherited is None:
        monkeypatch.delenv(DEVICE_KEY_ENV, raising=False)
    else:
        monkeypatch.setenv(DEVICE_KEY_ENV, inherited)
    slot = get_host_assignments(parse_hosts("host0:1"), 1)[0]
    host = Host("host0", None, "127.0.0.1", "lo", "0", 0)
    env = rank_env(host, create_slot_env_vars(slot),
                   {} if given is None else {DEVICE_KEY_ENV: given}, host_device_key)
    assert env.get(DEVICE_KEY_ENV) == expected
    assert env["HOROVOD_RANK"] == "0" and env["CROSSOVER_HOST_INDEX"] == "0"
