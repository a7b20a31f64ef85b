"""crossover-plan's outputs share stdout without mixing (issue 63 item 4): `--slurm -` writes
only the script there (a redirected script once began with the markdown report), `--json` and
`--slurm` together both write (`--json -` once returned before `--slurm`), and both on stdout
is refused in one line before anything is written."""
from __future__ import annotations

import json

import pytest

from crossover_tf_planner import cli

from launch_line_helpers import PROFILES


@pytest.fixture
def paths(tmp_path) -> list[str]:
    written = []
    for profile in PROFILES:
        written.append(str(tmp_path / f"{profile.name}.json"))
        profile.to_json(written[-1])
    return written


def expected_script(paths: list[str], tmp_path) -> str:
    """The script as --slurm PATH writes it, for comparing what stdout carries."""
    script = tmp_path / "expected.sh"
    assert cli.run(["pair", *paths, "--slurm", str(script)]) == 0
    return script.read_text()


def test_slurm_on_stdout_is_only_the_script(paths, tmp_path, capsys):
    script = expected_script(paths, tmp_path)
    capsys.readouterr()
    assert cli.run(["pair", *paths, "--slurm", "-"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("#!/bin/bash\n") and out == script
    assert "| job A | job B |" in err  # the report is still shown, off the script's stream


def test_json_file_and_slurm_on_stdout_both_write(paths, tmp_path, capsys):
    script = expected_script(paths, tmp_path)
    capsys.readouterr()
    plan = tmp_path / "plan.json"
    assert cli.run(["pair", *paths, "--json", str(plan), "--slurm", "-"]) == 0
    assert capsys.readouterr().out == script
    assert json.loads(plan.read_text())["unpaired"] == ["C"]


def test_json_on_stdout_and_slurm_file_both_write(paths, tmp_path, capsys):
    script = expected_script(paths, tmp_path)
    capsys.readouterr()
    launch = tmp_path / "launch.sh"
    assert cli.run(["pair", *paths, "--json", "-", "--slurm", str(launch)]) == 0
    assert json.loads(capsys.readouterr().out)["unpaired"] == ["C"]
    assert launch.read_text() == script


def test_json_and_slurm_both_on_stdout_is_refused(paths, capsys):
    assert cli.run(["pair", *paths, "--json", "-", "--slurm", "-"]) == cli.EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "--json" in err and "--slurm" in err


def test_a_bad_command_writes_nothing_on_stdout(paths, capsys):
    assert cli.run(["pair", *paths, "--slurm", "-", "--command", "no-equals"]) == \
        cli.EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert out == "" and "JOB=COMMAND" in err


def test_the_options_take_experiments_plans_underscore_spelling_too():
    """crossover-plan's --device-model against experiments.plan's --device_model (issue 63
    item 5): a command copied from one to the other runs either way."""
    from crossover_tf_planner import cli
    dashed = cli._parser().parse_args(["recommend", "a.json", "b.json", "--device-model", "cpu",
                                       "--min-gain", "0.1", "--link-contention", "c.json"])
    underscored = cli._parser().parse_args(["recommend", "a.json", "b.json", "--device_model",
                                            "cpu", "--min_gain", "0.1", "--link_contention",
                                            "c.json"])
    assert vars(dashed) == vars(underscored)
    assert (underscored.device_model, underscored.min_gain) == ("cpu", 0.1)
