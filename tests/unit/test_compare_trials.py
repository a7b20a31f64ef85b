"""Repeated trials (experiments/comparison/trials.py): their order design, how they combine,
and the report and sweep tables and plots they make, on hand-made stats."""
from __future__ import annotations

import collections
import dataclasses
import re

import pytest

from crossover_tf_planner import validate as planner_validate
from experiments.analysis import report, sweep
from experiments.comparison import trials
from crossover_tf_planner.compare_record import Regime
from compare_fakes import trial_results

pytestmark = pytest.mark.usefixtures("compare_flags")


# -- trials ---------------------------------------------------------------------------------------
def _position_and_adjacency_counts(orders: list[list[str]]) -> tuple[set[int], set[int]]:
    """How often each scenario takes each position, and each ordered pair runs back to back
    (as sets of the distinct counts: {k} means perfectly balanced)."""
    names = orders[0]
    positions = collections.Counter((name, i) for order in orders for i, name in enumerate(order))
    pairs = collections.Counter(p for o in orders for p in zip(o, o[1:]))
    return ({positions[(n, i)] for n in names for i in range(len(names))},
            {pairs[(a, b)] for a in names for b in names if a != b})


@pytest.mark.parametrize("names", [["sequential", "naive", "crossover", "crossover_turn"],
                                   ["sequential", "naive", "crossover"],
                                   ["sequential", "naive"], list("abcdef"), list("abcde")])
def test_williams_orders_balance_positions_and_neighbours(names):
    """The issue's 4 scenarios over 3 rotated trials always ran naive just before crossover
    and crossover never last; a Williams design balances both: 4 (even) trials put every
    scenario in every position once and every ordered pair back to back once; an odd count
    needs the mirrored square too (2n trials: each pair back to back twice), its first n
    trials balancing positions."""
    rows = len(trials.williams_square(len(names)))
    assert rows == (len(names) if len(names) % 2 == 0 else 2 * len(names))
    orders = trials.trial_orders(names, rows)
    assert orders[0] == names  # the first trial keeps the given order
    assert _position_and_adjacency_counts(orders) == ({rows // len(names)},) * 2
    latin = trials.trial_orders(names, len(names))
    assert _position_and_adjacency_counts(latin)[0] == {1}
    assert trials.trial_order(names, rows) == names  # cycles after a full design
    design = trials.order_design(names, 3)
    assert design.positions_balanced == (len(names) == 3)
    assert not design.adjacency_balanced
    assert trials.order_design(names, rows).adjacency_balanced


def test_unbalanced_trial_count_is_said_in_compare_md():
    result = dataclasses.replace(trials.combine(trial_results([1.5, 1.8, 1.2])),
              order_design=trials.order_design(["sequential", "naive", "crossover",
                                                   "crossover_turn"], 3))
    assert "positions are NOT balanced: 3 trials is not a multiple" in report.markdown(result)
    result = dataclasses.replace(
        result, order_design=trials.order_design(["sequential", "naive", "crossover"], 3))
    assert "which scenario runs just before which is not balanced (needs a multiple of 6" \
        in report.markdown(result)




# Crossover speed-ups of three trials, each within its ideal (1.909x sequential here): a 1.8x
# trial's crossover_turn (1.15x crossover, 2.07x) would beat it, fail its own check and be left
# out of the ratios it puts in doubt (trials.left_out_ratios).
SPEEDUPS = [1.5, 1.6, 1.2]


def test_combined_trials_report_median_and_spread_and_stay_valid_for_the_planner():
    combined = trials.combine(trial_results(SPEEDUPS))
    assert not combined.checks and not combined.left_out
    spread = combined.ratio_spread["crossover_over_sequential"]
    assert spread.values == pytest.approx([1.5, 1.6, 1.2])
    assert (spread.median, spread.min, spread.max) == pytest.approx((1.5, 1.2, 1.6))
    assert combined.ratios["crossover_over_sequential"] == pytest.approx(1.5)
    assert combined.ratios["crossover_over_naive"] == pytest.approx(1.5 / 1.2)
    assert combined.trials == 3 and combined.representative_trial == 0
    assert combined.scenarios is combined.per_trial[0].scenarios
    # M/C from the solo profiles: 100 ms over 110 ms of device time.
    assert trials.comm_to_compute(combined) == pytest.approx(0.1 / 0.11)
    planner = planner_validate.validate_comparison(combined, sim_steps=30)
    assert planner["normalised_ratios"]["crossover/naive"]["measured"] == pytest.approx(1.25)


def test_even_trial_count_shows_the_lower_median_trial():
    assert trials.representative_trial(trial_results([1.8, 1.2])) == 1


def test_markdown_and_png_show_the_spread(tmp_path):
    result = dataclasses.replace(trials.combine(trial_results(SPEEDUPS)),
              regime=Regime(**{"comm_to_compute_asked": 1.0, "bandwidth_source": "calibrated",
                         "bandwidth_mbit": 62.5,
                         "achieved_comm_to_compute": trials.spread([0.9, 0.95, 1.1])}))
    table = report.markdown(result)
    assert "| crossover / sequential | 1.500 [1.200–1.600] |" in table
    assert "median [min–max] of 3 trials" in table
    assert "| M/C asked for | 1 |" in table
    assert "| M/C achieved (solo runs) | 0.950 [0.900–1.100] |" in table
    assert "| bandwidth (Mbit/s, calibrated) | 62.5 |" in table
    unshaped = report.markdown(
        dataclasses.replace(result, settings={"cluster": {"emulated": False}}))
    assert "| bandwidth (Mbit/s, calibrated, NOT applied: localhost fallback) |" in unshaped
    assert "Horovod cycle time" not in unshaped  # an older record: no row
    cycled = report.markdown(dataclasses.replace(
        result, settings={"cluster": {"emulated": True, "horovod_cycle_time_ms": 10.0}}))
    assert "| Horovod cycle time (ms, every rank: HOROVOD_CYCLE_TIME) | 10 |" in cycled
    leased = {j: result.scenarios["crossover"].jobs[j] for j in "AB"}
    report.plot(result, leased, str(tmp_path / "compare.png"))
    assert (tmp_path / "compare.png").stat().st_size > 10_000


def test_sweep_rows_pair_measured_spread_with_predictions(tmp_path):
    result = dataclasses.replace(trials.combine(trial_results([1.5, 1.8, 1.2])),
              regime=Regime(**{"comm_to_compute_asked": 1.0, "bandwidth_mbit": 62.5,
                         "achieved_comm_to_compute": trials.spread([0.9, 0.95, 1.1])}))
    point = sweep.row(result)
    measured = point["crossover_over_naive"]["measured"]
    assert (measured["median"], measured["min"], measured["max"]) == pytest.approx(
        (1.5 / 1.2, 1.2 / 1.2, 1.8 / 1.2))
    predicted = [t.planner["aggregate_images_ratios"]["crossover/naive"]["analytical"]
                 for t in result.per_trial]
    assert point["crossover_over_naive"]["analytical"] == pytest.approx(sorted(predicted)[1])
    table = sweep.markdown([point])
    # The spread, then the bootstrap interval: three trials of equal-length steps resample to
    # their own min and max, and 1.0 inside it is a tie.
    assert re.search(r"\| 1 \| 0\.95 \[0\.90–1\.10\] \| 62\.5 \| 1\.250 \[1\.000–1\.500\]; "
                     r"95% 1\.000–1\.500 \(tie\) \| \d\.\d{3} / \d\.\d{3} \|", table), table
    assert point["crossover_over_naive"]["interval"]["low"] == pytest.approx(1.0)
    fixed_link = sweep.markdown([{**point, "comm_to_compute_asked": None}])
    assert "| — | 0.95 [0.90–1.10] | 62.5 |" in fixed_link
    sweep.plot([point, {**point, "achieved_comm_to_compute": trials.spread([2.0]).to_dict()}],
               str(tmp_path / "sweep.png"))
    assert (tmp_path / "sweep.png").stat().st_size > 10_000

