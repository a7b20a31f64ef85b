"""Job profiles: JSON round trip, loader from training stats, clear errors."""

import pytest

from crossover_tf.planner.profile import JobProfile, load_profiles, profile_from_train_stats


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


def test_from_train_stats_puts_the_rest_of_the_step_in_other():
    stats = {"step_time_s": 0.12, "compute_s": 0.05, "comm_s": 0.04,
             "global_batch_size": 256, "comm_std_s": 0.004}
    profile = profile_from_train_stats(stats, "resnet")
    assert profile.other_s == pytest.approx(0.03)
    assert profile.period_s == pytest.approx(0.12)
    assert profile.images_per_step == 256
    assert profile.comm_std_s == 0.004 and profile.source == "measured"
    with_apply = profile_from_train_stats({**stats, "apply_s": 0.01}, "resnet")
    assert with_apply.device_s == pytest.approx(0.06)
    assert with_apply.other_s == pytest.approx(0.02)


def test_from_train_stats_rejects_missing_keys():
    with pytest.raises(ValueError, match="comm_s"):
        profile_from_train_stats({"step_time_s": 0.1, "compute_s": 0.05,
                                  "global_batch_size": 64}, "A")
    with pytest.raises(ValueError, match="step_time_s"):
        profile_from_train_stats({"step_time_s": "x", "compute_s": 0.05, "comm_s": 0.01,
                                  "global_batch_size": 64}, "A")


def test_load_profiles_rejects_duplicate_names(tmp_path):
    paths = []
    for i in range(2):
        paths.append(str(tmp_path / f"{i}.json"))
        JobProfile(name="same", compute_s=0.05, comm_s=0.05).to_json(paths[-1])
    with pytest.raises(ValueError, match="unique"):
        load_profiles(paths)
