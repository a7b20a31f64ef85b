"""A long comparison says where it is (issue 63 item 6c): one line per trial on stdout, with
the trial's number of all, the time since the trials began and an estimate of what is left,
so a 40-minute run is not silent between its scenarios' lines."""
from __future__ import annotations

import re

import pytest

from experiments import compare
from experiments.comparison import progress

pytestmark = pytest.mark.usefixtures("compare_flags")

LINE = re.compile(r"^Trial (\d+) of (\d+) done \(([a-z_, ]+)\) in [\d.]+ min; "
                  r"[\d.]+ min elapsed, about [\d.]+ min left$", re.M)


def test_every_trial_prints_one_progress_line(fake_runs, tmp_path, capsys):
    compare.run(overrides={"bandwidth_mbit": 50.0, "trials": 3, "out_dir": str(tmp_path)})
    lines = LINE.findall(capsys.readouterr().out)
    assert [(i, n) for i, n, _ in lines] == [("1", "3"), ("2", "3"), ("3", "3")]
    assert lines[1][2] == "naive, crossover, sequential"  # the trial's own order


def test_the_estimate_is_the_mean_trial_times_the_trials_left(capsys):
    now = [100.0]
    tracker = progress.TrialProgress(trials=4, clock=lambda: now[0])
    for minutes in (2.0, 4.0):
        now[0] += 60 * minutes
        tracker.trial_done(["a", "b"])
    assert capsys.readouterr().out.splitlines() == [
        "Trial 1 of 4 done (a, b) in 2.0 min; 2.0 min elapsed, about 6.0 min left",
        "Trial 2 of 4 done (a, b) in 4.0 min; 6.0 min elapsed, about 6.0 min left"]
