"""The hypervisor's steal per scenario run (comparison/calibrate.steal_record) and the report's
table of it (experiments/analysis/steal.py), on a fake /proc/stat and the fake comparison."""
from __future__ import annotations

import json
import os

import pytest

from crossover_tf_planner.compare_record import Comparison, Trial
from experiments import compare
from experiments.analysis import steal
from experiments.comparison import calibrate, scenarios

pytestmark = pytest.mark.usefixtures("compare_flags")
TICK = os.sysconf("SC_CLK_TCK")


def test_stolen_time_is_the_first_lines_steal_field(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(f"cpu  10 0 5 100 0 0 3 {3 * TICK} 0 0\ncpu0 5 0 2 50 0 0 1 {TICK} 0 0\n")
    assert calibrate.stolen_s(str(stat)) == pytest.approx(3.0)
    stat.write_text("cpu  10 0 5 100 0 0 3\n")  # a kernel that keeps no steal time
    assert calibrate.stolen_s(str(stat)) is None
    stat.write_text("cpu  10 0 5 100 0 0 3 garbled\n")
    assert calibrate.stolen_s(str(stat)) is None  # a record of the run, never its end
    assert calibrate.stolen_s(str(tmp_path / "missing")) is None


def test_a_block_records_what_was_stolen_while_it_ran(monkeypatch):
    readings = iter([100.0, 102.5])
    monkeypatch.setattr(calibrate, "stolen_s", lambda: next(readings))
    record: dict = {}
    with calibrate.steal_record(record):
        pass
    assert record["stolen_s"] == pytest.approx(2.5)
    assert record["wall_s"] >= 0 and record["cpus"] == (os.cpu_count() or 1)
    monkeypatch.setattr(calibrate, "stolen_s", lambda: None)
    untouched: dict = {}
    with calibrate.steal_record(untouched):
        pass
    assert untouched == {}


def _trial(number: int, runs: dict) -> Trial:
    return Trial({}, settings={"trial": number, "steal": runs})


def test_runs_over_the_flag_share_are_marked_and_counted():
    quiet = {"stolen_s": 0.2, "wall_s": 60.0, "cpus": 2}     # 0.17% of 120 CPU s
    noisy = {"stolen_s": 3.0, "wall_s": 60.0, "cpus": 2}     # 2.5%
    result = Comparison({}, per_trial=[_trial(0, {"naive": quiet, "crossover": quiet}),
                                       _trial(1, {"naive": quiet, "crossover": noisy})])
    lines = steal.steal_lines(result)
    assert "| trial | naive | crossover |" in lines
    assert "| 0 | 0.2 (0.2%) | 0.2 (0.2%) |" in lines
    assert "| 1 | 0.2 (0.2%) | **3.0 (2.5%)** |" in lines
    assert lines[-1] == "1 of 4 scenario runs lost more than 1% to the hypervisor."


def test_records_without_steal_add_nothing():
    assert steal.steal_lines(Comparison({}, per_trial=[Trial({}, settings={"trial": 0})])) == []


def test_a_one_trial_report_tables_its_own_runs():
    noisy = {"stolen_s": 3.0, "wall_s": 60.0, "cpus": 2}
    lines = steal.steal_lines(Comparison.of_trial(_trial(0, {"crossover": noisy})))
    assert "| 0 | **3.0 (2.5%)** |" in lines


def test_a_comparison_records_each_scenario_runs_steal(fake_runs, monkeypatch, tmp_path):
    """Every scenario of every trial keeps its own steal in compare.json, and compare.md marks
    the one run the hypervisor took the cores from (trial 1's crossover)."""
    stolen = {"s": 1000.0}
    monkeypatch.setattr(calibrate, "stolen_s", lambda: stolen["s"])
    fake = scenarios.run_scenario

    def stealing(cluster, c, name, out, run_name="", jobs=("A", "B"), steps=None,
                 start_shifts=None):
        if run_name == "t1_crossover":
            stolen["s"] += 4.0
        return fake(cluster, c, name, out, run_name, jobs, steps, start_shifts)

    monkeypatch.setattr(scenarios, "run_scenario", stealing)
    compare.run(overrides={"comm_to_compute": 1.0, "trials": 2, "out_dir": str(tmp_path)})
    saved = json.loads((tmp_path / "compare.json").read_text())
    for trial in saved["per_trial"]:
        runs = trial["settings"]["steal"]
        assert set(runs) == set(trial["settings"]["order"])
        for name, run in runs.items():
            expected = 4.0 if (trial["settings"]["trial"], name) == (1, "crossover") else 0.0
            assert run["stolen_s"] == pytest.approx(expected), (trial["settings"]["trial"], name)
    markdown = (tmp_path / "compare.md").read_text()
    assert markdown.count("**4.0 (") == 1
    runs = sum(len(trial["settings"]["order"]) for trial in saved["per_trial"])
    assert f"1 of {runs} scenario runs lost more than 1% to the hypervisor." in markdown
