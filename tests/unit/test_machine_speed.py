"""The report's line on this machine against the README's run, and the README's own figures
(issue 52 item 5: results travel between machines only with their C and M)."""
from __future__ import annotations

import dataclasses
import json
import re

import pytest

from conftest import DATA, REPO_ROOT
from crossover_tf_planner.compare_record import Comparison
from experiments.analysis import machine_speed, report

SAVED = DATA / "compare_v1" / "compare.json"


def _reference(**changes) -> machine_speed.ReferenceRun:
    fields = {"date": "2026-12-01", "commit": "abc1234", "backend": "horovod",
              "compute_ms": {"A": 1000.0, "B": 900.0}, "comm_ms": {"A": 800.0, "B": 700.0}}
    return machine_speed.ReferenceRun(**{**fields, **changes})


def test_solo_times_are_each_jobs_median_over_the_trials():
    result = Comparison.from_json(SAVED)
    times = machine_speed.solo_times_ms(result)
    assert sorted(times) == ["A", "B"]
    for job, (compute, comm) in times.items():
        runs = [t.scenarios[f"solo_{job}"].jobs[job] for t in result.per_trial]
        assert min(r.device_s for r in runs) * 1e3 <= compute <= max(r.device_s for r in runs) * 1e3
        assert min(r.comm_s for r in runs) * 1e3 <= comm <= max(r.comm_s for r in runs) * 1e3


def test_speed_line_states_both_runs_c_and_m_and_the_core_speed():
    result = Comparison.from_json(SAVED)
    times = machine_speed.solo_times_ms(result)
    line = machine_speed.speed_line(result, _reference())
    assert "2026-12-01, abc1234, horovod" in line
    for job, (compute, comm) in times.items():
        assert f"job {job}: C {compute:.0f} ms (README " in line
        assert f"M {comm:.0f} ms (README " in line
    speed = float(re.search(r"step ([0-9.]+)x as fast", line).group(1))
    assert speed == pytest.approx(1000.0 / times["A"][0], abs=0.006)


def test_no_line_without_a_reference_or_a_job_in_common():
    result = Comparison.from_json(SAVED)
    assert machine_speed.speed_line(result, None) is None
    assert machine_speed.speed_line(result, _reference(compute_ms={"X": 1.0},
                                                       comm_ms={"X": 1.0})) is None


def test_report_carries_the_line_when_the_readme_run_is_recorded(monkeypatch, tmp_path):
    path = tmp_path / "readme_run.json"
    reference = _reference()
    path.write_text(json.dumps(vars(reference)))
    monkeypatch.setattr(machine_speed, "README_RUN", path)
    text = report.markdown(Comparison.from_json(SAVED))
    assert "This machine against the README's run (2026-12-01, abc1234, horovod)" in text


def test_no_line_for_a_comparison_whose_job_a_trains_something_else():
    """A tiny model's comparison (a test's, a sweep of another model) is no measure of the
    core against the README's ResNet-20: no line rather than an absurd speed."""
    result = Comparison.from_json(SAVED)
    other = dataclasses.replace(result, settings={**result.settings, "model": "mlp"})
    assert machine_speed.speed_line(other, _reference()) is None
    batch = dataclasses.replace(result, settings={**result.settings, "global_batch_size": 32})
    assert machine_speed.speed_line(batch, _reference()) is None


def test_unknown_keys_in_the_record_are_refused(tmp_path):
    path = tmp_path / "readme_run.json"
    path.write_text(json.dumps({**vars(_reference()), "speed": 2}))
    with pytest.raises(ValueError, match="unknown keys"):
        machine_speed.load_reference(path)


def test_readme_states_the_recorded_runs_c_and_m():
    """docs/readme_run.json is one of the README's runs: its row of the results table (rendered
    from docs/results.json) gives every job's C and M as recorded, so the report's line and the
    README agree."""
    reference = machine_speed.load_reference()
    assert reference is not None, "docs/readme_run.json is missing"
    row = next((line for line in (REPO_ROOT / "README.md").read_text().splitlines()
                if line.startswith("|") and reference.date in line
                and reference.commit in line), None)
    assert row is not None, (reference.date, reference.commit)
    for job in reference.compute_ms:
        assert (f"{job} {reference.compute_ms[job]:.0f} / "
                f"{reference.comm_ms[job]:.0f}") in row, (job, row)
