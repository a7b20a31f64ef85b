"""The typed comparison record reads compare.json files written before it existed."""
from __future__ import annotations

import json

import pytest

from crossover_tf_planner import registry, validate
from crossover_tf_planner.compare_record import Comparison
from experiments.analysis import machine_speed, report
from conftest import DATA

# Written by compare.py (fake cluster: 2 trials, calibrated, with crossover_turn) before the
# record was typed.
SAVED = DATA / "compare_v1"


def test_a_compare_json_written_before_loads_and_reports_the_same(monkeypatch, tmp_path):
    # The report's line against the README's run changes with every README run
    # (test_machine_speed checks it): the saved report predates it.
    monkeypatch.setattr(machine_speed, "README_RUN", tmp_path / "absent.json")
    record = Comparison.from_json(SAVED / "compare.json")
    assert record.to_dict() == json.loads((SAVED / "compare.json").read_text())
    assert report.markdown(record) == (SAVED / "compare.md").read_text()
    assert record.regime.achieved_comm_to_compute.median == pytest.approx(2.0)
    assert validate.validate_comparison(record)["recommendation"] == record.planner[
        "recommendation"]


def test_a_file_that_is_no_comparison_is_refused_naming_the_file_and_what_is_missing(tmp_path):
    path = tmp_path / "compare.json"
    path.write_text(json.dumps({"ratios": {}}))
    with pytest.raises(ValueError, match=rf"{path}: .*lacks a 'scenarios' object"):
        Comparison.from_json(path)


def test_every_registered_ratio_has_one_key_and_the_table_shows_each_once():
    keys = [r.key for r in registry.SCENARIO_RATIOS]
    assert len(set(keys)) == len(keys)
    assert len({m.key for m in registry.TABLE}) == len(registry.TABLE)
    assert registry.scenario_ratio("crossover", "naive").key == "crossover_over_naive"
