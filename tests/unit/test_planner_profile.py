"""Job profiles: JSON round trip, loader from training stats, clear errors."""

import os

import pytest

from crossover_tf_planner.job_stats import JobStats
from crossover_tf_planner.profile import JobProfile, load_profiles, profile_from_train_stats


def test_json_round_trip_through_file(tmp_path):
    profile = JobProfile(name="A", compute_s=0.05, comm_s=0.04, compute_std_s=0.002,
                         comm_std_s=0.003, apply_s=0.001, handoff_s=0.0002,
                         images_per_step=64, source="measured")
    path = tmp_path / "a.json"
    profile.to_json(path)
    assert JobProfile.from_json(path) == profile
    assert JobProfile.from_json(profile.to_json()) == profile
    assert profile.period_s == pytest.approx(0.091)


@pytest.mark.parametrize("field,value", [("compute_s", -0.1), ("comm_s", -1e-3),
                                         ("comm_std_s", float("nan")), ("compute_s", 0.0),
                                         ("images_per_step", 0), ("comm_s", "fast")])
def test_bad_times_name_the_field(field, value):
    data = {"name": "A", "compute_s": 0.05, "comm_s": 0.04, field: value}
    with pytest.raises(ValueError, match=field):
        JobProfile.from_dict(data)


def test_missing_and_unknown_fields_are_named():
    with pytest.raises(ValueError, match="comm_s"):
        JobProfile.from_dict({"name": "A", "compute_s": 0.05})
    with pytest.raises(ValueError, match="bogus"):
        JobProfile.from_dict({"name": "A", "compute_s": 0.05, "comm_s": 0.1, "bogus": 1})
    with pytest.raises(ValueError, match="source"):
        JobProfile(name="A", compute_s=0.05, comm_s=0.1, source="guess")


def _stats(**fields) -> JobStats:
    base = {"job": "resnet", "global_batch_size": 256, "steps": 20, "timed_steps": 15,
            "step_time_s": 0.12, "images_per_s": 2100.0, "timed_wall_s": 1.8,
            "compute_s": 0.05, "comm_s": 0.04}
    return JobStats(**{**base, **fields})


def test_from_train_stats_puts_the_rest_of_the_step_in_other():
    profile = profile_from_train_stats(_stats())
    assert profile.name == "resnet"
    assert profile.other_s == pytest.approx(0.03)
    assert profile.period_s == pytest.approx(0.12)
    assert profile.images_per_step == 256 and profile.source == "measured"
    with_apply = profile_from_train_stats(_stats(apply_s=0.01), "renamed", handoff_s=2e-4)
    assert with_apply.name == "renamed" and with_apply.handoff_s == 2e-4
    assert with_apply.device_s == pytest.approx(0.06)
    assert with_apply.other_s == pytest.approx(0.02)


def test_from_train_stats_needs_the_lease_phases():
    with pytest.raises(ValueError, match="lack comm_s"):
        profile_from_train_stats(_stats(comm_s=None))
    with pytest.raises(ValueError, match="compute_s must be finite"):
        profile_from_train_stats(_stats(compute_s=float("nan")))


def test_job_stats_json_round_trip_and_clear_errors(tmp_path):
    stats = _stats(apply_s=0.01, losses=[2.3, 2.1], phases_ns=[[1, 2, 3, 4, 5]],
                   lease={"acquires": 2.0})
    path = tmp_path / "stats.json"
    stats.to_json(path)
    assert JobStats.from_json(path) == stats
    assert JobStats.from_json(stats.to_json()) == stats
    assert stats.device_s == pytest.approx(0.06) and stats.timed_images == 256 * 15
    assert _stats(apply_s=None).device_s is None
    with pytest.raises(ValueError, match="missing required field.*timed_wall_s"):
        JobStats.from_dict({k: v for k, v in stats.to_dict().items() if k != "timed_wall_s"})
    with pytest.raises(ValueError, match="unknown field.*step_s"):
        JobStats.from_dict({**stats.to_dict(), "step_s": 0.1})


def test_load_profiles_rejects_duplicate_names(tmp_path):
    paths = []
    for i in range(2):
        paths.append(str(tmp_path / f"{i}.json"))
        JobProfile(name="same", compute_s=0.05, comm_s=0.05).to_json(paths[-1])
    with pytest.raises(ValueError, match="unique"):
        load_profiles(paths)


def test_comm_cpu_fit_separates_waiting_from_moving_bytes():
    from crossover_tf_planner.comm_cost import CommCpu, fit
    # Idle: 0.1 CPU s over 2 s of waiting; each 4 MB allreduce: 0.5 s wall, 0.065 CPU s,
    # of which 0.05 * 0.5 = 0.025 is waiting and 0.04 (0.01 per MB) moves the bytes.
    cost = fit({"idle_cpu_s": 0.1, "idle_wall_s": 2.0, "cpu_s_per_allreduce": 0.065,
                "wall_s_per_allreduce": 0.5, "megabytes": 4.0})
    assert cost.cpu_per_wait_s == pytest.approx(0.05)
    assert cost.cpu_s_per_mb == pytest.approx(0.01)
    assert cost.comm_cpu_s(comm_s=1.0, megabytes=2.0) == pytest.approx(0.05 + 0.02)
    assert CommCpu.from_dict(cost.to_dict()) == cost
    # Less CPU per allreduce than its waiting alone would take: nothing for the bytes.
    assert fit({"idle_cpu_s": 1.0, "idle_wall_s": 1.0, "cpu_s_per_allreduce": 0.1,
                "wall_s_per_allreduce": 0.5, "megabytes": 1.0}).cpu_s_per_mb == 0.0


def test_comm_cpu_fit_charges_the_cores_softirq_to_the_bytes():
    """The kernel's network work on the rank's core is no process's CPU time, yet it takes the
    core from the computing job: fit adds it to the per-MB cost (issue 52)."""
    from crossover_tf_planner.comm_cost import fit
    probe = {"idle_cpu_s": 0.1, "idle_wall_s": 2.0, "cpu_s_per_allreduce": 0.065,
             "wall_s_per_allreduce": 0.5, "megabytes": 4.0}
    assert fit({**probe, "softirq_s_per_allreduce": 0.02}).cpu_s_per_mb == pytest.approx(
        (0.04 + 0.02) / 4)
    assert fit(probe).cpu_s_per_mb == pytest.approx(0.01)  # older probes: none measured


def test_core_softirq_reads_the_softirq_column_of_this_processes_cores(tmp_path):
    from experiments.probes.comm_cpu import core_softirq_s
    cores = sorted(os.sched_getaffinity(0))
    lines = ["cpu  1 2 3 4 5 6 7000 8 0 0"]
    lines += [f"cpu{c} 1 2 3 4 5 6 {100 * (c + 1)} 8 0 0" for c in cores]
    lines += [f"cpu{max(cores) + 1} 1 2 3 4 5 6 99999 8 0 0", "intr 5 6"]
    stat = tmp_path / "stat"
    stat.write_text("\n".join(lines) + "\n")
    expected = sum(100 * (c + 1) for c in cores) / os.sysconf("SC_CLK_TCK")
    assert core_softirq_s(str(stat)) == pytest.approx(expected)
