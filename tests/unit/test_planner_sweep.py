"""Sweep: shift helps at harmonic period ratios only; crossover also elsewhere."""

import pytest

from crossover_tf_planner import sweep

CM = (0.5, 1.0, 2.0)
PERIODS = (1.0, 1.5, 2.0)


@pytest.fixture(scope="module")
def result():
    return sweep.run_sweep(CM, PERIODS)


def test_shift_and_crossover_where_expected(result):
    shift, cross = result.helps("shift"), result.helps("crossover")
    assert shift.shape == (3, 3, 3)
    assert shift[1, 1, 0] and cross[1, 1, 0]          # equal jobs, equal periods
    assert not shift[1, 1, 1] and cross[1, 1, 1]      # periods 2:3: only crossing helps
    assert not shift[:, :, 1].any()


def test_headline_fractions_are_consistent(result):
    h = result.headline()
    shift, cross = result.helps("shift"), result.helps("crossover")
    assert h["pairs"] == 27
    assert h["shift_helps_vs_naive"] == pytest.approx(shift.mean())
    assert h["neither_helps"] == pytest.approx((~shift & ~cross).mean())
    assert h["crossover_helps_vs_naive"] > h["shift_helps_vs_naive"]


def test_outputs_table_and_png(result, tmp_path):
    table = result.to_markdown()
    assert table.count("\n| ") == len(PERIODS) + 1 and "shift helps" in table
    png = tmp_path / "sweep.png"
    sweep.save_heatmap(result, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_grid():
    with pytest.raises(ValueError, match="cm_ratios"):
        sweep.run_sweep((), PERIODS)
    with pytest.raises(ValueError, match="> 0"):
        sweep.run_sweep((-1.0,), PERIODS)


def test_the_shift_experiments_cells_are_marked(result):
    """Job A at C/M 1 with T_B/T_A 1, 1.5 and 2 (scripts/run_shift.sh) are marked in the
    table (†) and outlined on the heat map, where their measurements will go."""
    assert result.measured_cells() == [(1, 0), (1, 1), (1, 2)]
    table = result.to_markdown()
    assert table.count("†") == 4 and "| 1.5 | 0% / 33% | 0% / 67%† |" in table  # and a legend
    off_grid = sweep.run_sweep((0.5, 2.0), (3.0,))
    assert off_grid.measured_cells() == [] and "†" not in off_grid.to_markdown()
