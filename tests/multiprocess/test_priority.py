"""Priority mode with real Keras jobs: a secondary's micro-batched step equals the full batch,
and a primary never waits for work a secondary started after the primary asked."""
from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest

from conftest import WORKERS, run_bounded, run_worker_pair
from crossover_tf.profiling import phases as timeline
from crossover_tf.lease import TAG_APPLY, TAG_COMPUTE

WORKER = str(WORKERS / "priority_worker.py")


def _run(tmp_path: pathlib.Path, name: str, env: dict[str, str], *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    result = run_bounded([sys.executable, WORKER, str(out), *args], env, timeout=240)
    assert result.returncode == 0, result.stdout[-4000:]
    return json.loads(out.read_text())


@pytest.mark.multiprocess
@pytest.mark.slow
def test_micro_batched_secondary_equals_the_full_batch(tmp_path: pathlib.Path, lease_group: str,
                                                       child_env: dict[str, str]) -> None:
    full = _run(tmp_path, "full", child_env, "--steps", "15")
    micro = _run(tmp_path, "micro", child_env, "--steps", "15", "--group", lease_group,
                 "--priority", "secondary", "--micro_batches", "4")
    np.testing.assert_allclose(micro["losses"], full["losses"], rtol=1e-6, atol=1e-6)
    for w_micro, w_full in zip(micro["weights"], full["weights"]):
        np.testing.assert_allclose(w_micro, w_full, rtol=1e-6, atol=1e-6)
    tags = np.asarray(micro["timeline"])[:, 3]
    assert (tags == TAG_COMPUTE).sum() == 4 * 16 and (tags == TAG_APPLY).sum() == 16  # +warm-up
    events = np.asarray(micro["timeline"])
    phases = timeline.step_phases(events)
    assert len(phases) == 16  # one step each, its compute from the first micro-batch's acquire
    assert phases[:, 0].tolist() == events[tags == TAG_COMPUTE][::4, 1].tolist()


def test_step_phases_span_every_micro_batch() -> None:
    """Two micro-batches (10-20, 25-35 ms) then the apply: the step computes 10-35 ms. A
    primary's hold between them is inside the span; an unfinished step is left out."""
    ms = 1_000_000
    events = [[5 * ms, 10 * ms, 20 * ms, TAG_COMPUTE], [20 * ms, 25 * ms, 35 * ms, TAG_COMPUTE],
              [60 * ms, 62 * ms, 65 * ms, TAG_APPLY], [65 * ms, 70 * ms, 80 * ms, TAG_COMPUTE],
              [80 * ms, 81 * ms, 90 * ms, TAG_COMPUTE], [95 * ms, 96 * ms, 0, TAG_APPLY]]
    phases = timeline.step_phases(events)
    assert (phases // ms).tolist() == [[10, 35, 60, 62, 65]]
    durations = timeline.phase_durations(phases)
    assert durations["compute_s"][0] == pytest.approx(0.025)
    assert durations["comm_s"][0] == pytest.approx(0.025)
    assert timeline.step_phases([[0, 1, 2, TAG_APPLY]]).shape == (0, 5)  # an apply alone


def _holds(timeline: list[list[int]]) -> np.ndarray:
    t = np.asarray(timeline, dtype=np.int64)
    return t[t[:, 2] > 0]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_primary_never_waits_for_new_secondary_work(tmp_path: pathlib.Path, lease_group: str,
                                                    child_env: dict[str, str]) -> None:
    """Two jobs of two ranks each (a job of one rank runs no allreduce, so its step would leave
    the secondary no window but the gap between steps): a primary and a micro-batched secondary."""
    common = ["--group", lease_group, "--jobs", "2", "--steps", "150", "--width", "256",
              "--barrier", f"{tmp_path / 'barrier'}:4", "--backend", "horovod"]
    run_worker_pair(WORKER, tmp_path, "horovod", common, child_env, a=("--priority", "primary"),
                    b=("--priority", "secondary", "--micro_batches", "4"))
    for rank in range(2):  # rank r of each job leases device cpu<r> (its local rank)
        primary, secondary = (json.loads((tmp_path / f"{job}_{rank}.json").read_text())
                              for job in ("a", "b"))
        assert primary["device_key"] == secondary["device_key"] == f"cpu{rank}"
        _check_secondary_starts_only_when_primary_is_away(
            f"rank {rank}", _holds(primary["timeline"]), _holds(secondary["timeline"]))


def _check_secondary_starts_only_when_primary_is_away(where: str, mine: np.ndarray,
                                                      theirs: np.ndarray) -> None:
    for _, acquired, released, _ in mine:
        overlap = np.minimum(released, theirs[:, 2]) - np.maximum(acquired, theirs[:, 1])
        assert not np.any(overlap > 0), f"{where}: both jobs held the device"
    # While the primary trains, a secondary may start only inside the primary's allreduce (from
    # its compute yield to its apply acquire) or once the primary has been away for longer than
    # its step-end reservation (0.05 s): never in the short gap between two primary steps.
    compute = mine[mine[:, 3] == TAG_COMPUTE]
    apply = mine[mine[:, 3] == TAG_APPLY]
    allreduce = np.stack([compute[:, 2], apply[:, 1]], axis=1)
    step_gaps = np.stack([apply[:-1, 2], compute[1:, 0]], axis=1)
    during = theirs[(theirs[:, 1] > mine[0, 0]) & (theirs[:, 1] < mine[-1, 2]), 1]
    in_allreduce = [np.any((allreduce[:, 0] <= start) & (start <= allreduce[:, 1]))
                    for start in during]
    assert sum(in_allreduce) >= 50, (
        f"{where}: only {sum(in_allreduce)} of {len(during)} secondary holds started in the "
        "primary's allreduce")
    for start, inside in zip(during, in_allreduce):
        after_reservation = np.any((step_gaps[:, 0] + 50_000_000 <= start)
                                   & (start <= step_gaps[:, 1]))
        assert inside or after_reservation, f"{where}: secondary started at {start} between steps"
    assert len(theirs) == 151 * 5, where  # every micro-batch and apply its own hold (+warm-up)
