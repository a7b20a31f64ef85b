"""crossover_tf.LeaseTensorBoard (issue 63 item 6b): a user's own fit logs how long
each step waited for the device lease, how long it held it and the share of the step it held
it, as TensorBoard scalars on rank 0, read back here from the event files. A fake strategy's
lease statistics stand in for the lease (tests/multiprocess/test_lease_tensorboard_fit.py runs a
real one)."""
from __future__ import annotations

import time
import types

import pytest

from tensorboard_events import read_scalars

WAIT_S, HOLD_S = 0.001, 0.004  # each step's lease deltas in the fake statistics
STEP_S = 0.02  # how long each fake step sleeps: far above HOLD_S, so the share is below 1
GAP_S = 1.5  # between two fits: a step that spanned it would have a share below HOLD_S / GAP_S


def fake_strategy(rank0: bool = True, crossover: bool = True) -> types.SimpleNamespace:
    calls = [0]

    def lease_stats() -> dict[str, float]:
        calls[0] += 1
        return {"wait_s": WAIT_S * calls[0], "hold_s": HOLD_S * calls[0], "acquires": 0.0}
    return types.SimpleNamespace(is_crossover=crossover, should_save_summary=rank0,
                                 lease_stats=lease_stats)


def run_steps(callback, steps: int) -> None:
    callback.on_train_begin()
    for batch in range(steps):
        callback.on_train_batch_begin(batch)
        time.sleep(STEP_S)
        callback.on_train_batch_end(batch, {"loss": 1.0})
    callback.on_train_end()


@pytest.mark.parametrize("log_every, written", [(1, [0, 1, 2, 3, 4, 5]), (3, [2, 5]),
                                                (4, [3, 5])])
def test_lease_scalars_are_written_with_sane_values(tmp_path, log_every, written):
    from crossover_tf import LeaseTensorBoard
    run_steps(LeaseTensorBoard(fake_strategy(), tmp_path, log_every=log_every), 6)
    scalars = read_scalars(tmp_path)
    assert set(scalars) == {"lease_wait_s", "lease_hold_s", "lease_held_share"}
    for tag, per_step in (("lease_wait_s", WAIT_S), ("lease_hold_s", HOLD_S)):
        assert [s for s, _ in scalars[tag]] == written
        for _, value in scalars[tag]:  # the mean over the steps since the last write
            assert value == pytest.approx(per_step)
    for _, share in scalars["lease_held_share"]:  # each step took STEP_S and some overhead
        assert 0 < share < HOLD_S / STEP_S * 1.01


def test_a_long_fit_keeps_no_per_step_record(tmp_path):
    """Only the window's sums are kept: StepTimer's records would grow with every step."""
    from crossover_tf import LeaseTensorBoard
    callback = LeaseTensorBoard(fake_strategy(), tmp_path, log_every=5)
    callback.on_train_begin()
    for batch in range(50):
        callback.on_train_batch_begin(batch)
        callback.on_train_batch_end(batch)
    assert callback._timer.records == []


def test_a_second_fit_goes_on_counting_steps_and_skips_the_gap(tmp_path):
    from crossover_tf import LeaseTensorBoard
    callback = LeaseTensorBoard(fake_strategy(), tmp_path)
    run_steps(callback, 2)
    time.sleep(GAP_S)  # between fits: no step, so it must not dilute the held share
    run_steps(callback, 2)
    shares = read_scalars(tmp_path)["lease_held_share"]
    assert [s for s, _ in shares] == [0, 1, 2, 3]
    assert min(v for _, v in shares) > 2 * HOLD_S / GAP_S


def test_only_rank_0_writes_and_a_job_without_a_group_is_refused(tmp_path):
    from crossover_tf import LeaseTensorBoard
    run_steps(LeaseTensorBoard(fake_strategy(rank0=False), tmp_path / "other"), 3)
    assert not (tmp_path / "other").exists()
    with pytest.raises(ValueError, match="needs a crossover group"):
        LeaseTensorBoard(fake_strategy(crossover=False), tmp_path)
    with pytest.raises(ValueError, match="log_every"):
        LeaseTensorBoard(fake_strategy(), tmp_path, log_every=0)
