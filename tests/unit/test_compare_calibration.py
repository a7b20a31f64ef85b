"""compare's calibration (experiments/comparison/calibration.py): the link's fit and the
bandwidth it chooses, on hand-made points."""
from __future__ import annotations


import pytest

from experiments.comparison import calibration
from experiments.comparison.calibration import CalibrationPoint, CommFit
from compare_fakes import MS


# -- calibration: fit and choice ------------------------------------------------------------------
def _points(fit: CommFit, compute_s: float, *bandwidths: float) -> list[CalibrationPoint]:
    return [CalibrationPoint(b, compute_s, fit.comm_s(b)) for b in bandwidths]


def test_fit_recovers_fixed_and_per_bandwidth_parts():
    truth = CommFit(fixed_s=20 * MS, per_mbit_s=5.0)
    for bandwidths in ((50, 200), (10, 40, 160)):
        fit = calibration.fit_comm_model(_points(truth, 0.1, *bandwidths))
        assert fit.fixed_s == pytest.approx(truth.fixed_s)
        assert fit.per_mbit_s == pytest.approx(truth.per_mbit_s)


def test_chosen_bandwidth_gives_the_asked_ratio():
    fit = CommFit(fixed_s=20 * MS, per_mbit_s=5.0)
    for ratio in (0.5, 1.0, 2.0):
        bandwidth = calibration.choose_bandwidth(fit, 0.1, ratio)
        assert fit.comm_s(bandwidth) / 0.1 == pytest.approx(ratio)
    assert calibration.choose_bandwidth(fit, 0.1, 1.0) == pytest.approx(5.0 / 0.08)


def test_unreachable_ratio_names_the_smallest_reachable_one():
    fit = CommFit(fixed_s=30 * MS, per_mbit_s=5.0)
    assert calibration.smallest_ratio(fit, 0.1) == pytest.approx(0.3)
    with pytest.raises(ValueError, match=r"unreachable.*smallest reachable ratio is about 0.3"):
        calibration.choose_bandwidth(fit, 0.1, 0.25)
    with pytest.raises(ValueError, match="outside the emulated link's range"):
        calibration.choose_bandwidth(fit, 0.1, 0.3 + 1e-9)  # needs a near-infinite link


def test_fit_rejects_points_that_cannot_set_the_ratio():
    with pytest.raises(ValueError, match="2 distinct bandwidths"):
        calibration.fit_comm_model([CalibrationPoint(50, 0.1, 0.1)] * 2)
    flat = [CalibrationPoint(50, 0.1, 0.1), CalibrationPoint(200, 0.1, 0.12)]
    with pytest.raises(ValueError, match="not the bottleneck"):
        calibration.fit_comm_model(flat)


def test_second_bandwidth_brackets_the_target_and_stays_apart():
    # M = 50 ms at 100 Mbit/s against C = 100 ms: for M/C = 1 guess 100 * 0.05 / 0.1 = 50.
    assert calibration.second_bandwidth(CalibrationPoint(100, 0.1, 0.05), 1.0) == 50
    # Already on target: a slower link, MIN_STEP away.
    assert calibration.second_bandwidth(CalibrationPoint(100, 0.1, 0.1), 1.0) == 50
    # Far off: at most MAX_STEP away.
    assert calibration.second_bandwidth(CalibrationPoint(100, 0.1, 100.0), 1.0) == 1600


def test_next_bandwidth_stops_once_the_fit_brackets_the_target():
    truth = CommFit(fixed_s=20 * MS, per_mbit_s=5.0)
    first = _points(truth, 0.1, 100)
    assert calibration.next_bandwidth(first, 1.0) == calibration.second_bandwidth(first[0], 1.0)
    assert calibration.next_bandwidth(_points(truth, 0.1, 100, 50), 1.0) is None  # B* = 62.5
    # B* = 5 / (0.5 - 0.02) = 10.4, far below the measured 100..400: measure there.
    assert calibration.next_bandwidth(_points(truth, 0.1, 100, 400), 5.0) == pytest.approx(
        5.0 / 0.48)
    # Far above: at most MAX_STEP beyond the fastest link measured.
    assert calibration.next_bandwidth(_points(truth, 0.1, 1, 2), 1.0) == 2 * calibration.MAX_STEP
    # Unreachable: more points cannot help, choose_bandwidth will say why.
    assert calibration.next_bandwidth(_points(truth, 0.1, 100, 50), 0.1) is None


def test_next_bandwidth_goes_slower_when_noise_swamps_the_link():
    noisy = [CalibrationPoint(100, 0.1, 0.043), CalibrationPoint(44, 0.12, 0.027)]
    assert calibration.next_bandwidth(noisy, 1.0) == 22
    at_floor = [CalibrationPoint(2, 0.1, 0.043), CalibrationPoint(1, 0.12, 0.027)]
    assert calibration.next_bandwidth(at_floor, 1.0) is None

