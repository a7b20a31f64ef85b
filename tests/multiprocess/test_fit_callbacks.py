"""The multi-worker tutorials' file-writing callbacks on every rank (issue 49, item 3).

Before: ModelCheckpoint and BackupAndRestore given to every rank with one directory raced
(FileExistsError on one rank) while the other rank sat in a collective until
collective_timeout_s (600 s), and TensorBoard wrote one event file per rank into one run. Now,
as under MultiWorkerMirroredStrategy, rank 0 writes the real files and the other ranks write to
scratch places of their own; every rank reads the chief's backup, so a restarted job resumes
every rank at the same epoch; a rank that raises ends its job at once.
"""
from __future__ import annotations

import json
import pathlib
import sys
import tempfile
import time

import pytest

from conftest import WORKERS, launch_command, run_bounded

WORKER = str(WORKERS / "strategy_worker.py")
COMMON = ["--backend", "tensorflow", "--no_callbacks", "--fit_only", "--steps", "8"]


def _run(tmp_path: pathlib.Path, child_env: dict, *flags: str):
    return run_bounded(launch_command("tensorflow", 2, sys.executable, WORKER,
                                      str(tmp_path / "out_RANK.json"), *COMMON, *flags),
                       child_env, 240)


def _scratch() -> set[str]:
    return {p.name for p in pathlib.Path(tempfile.gettempdir()).glob("crossover-rank*")}


@pytest.mark.multiprocess
@pytest.mark.slow
def test_checkpoint_backup_and_tensorboard_on_every_rank(tmp_path, child_env):
    files, before = tmp_path / "files", _scratch()
    result = _run(tmp_path, child_env, "--epochs", "2", "--file_callbacks", str(files))
    assert result.returncode == 0, result.stdout[-6000:]
    assert (files / "ckpt.keras").is_file()
    events = sorted((files / "logs" / "train").glob("events.out.tfevents.*"))
    assert len(events) == 1, events  # the chief's run only
    assert not (files / "backup").exists()  # BackupAndRestore's own clean-up at the end
    assert _scratch() == before  # the other rank's scratch directory is gone


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_restarted_job_resumes_every_rank_at_the_same_epoch(tmp_path, child_env):
    files = tmp_path / "files"
    killed = _run(tmp_path, child_env, "--epochs", "4", "--file_callbacks", str(files),
                  "--fail_at_epoch", "2")
    assert killed.returncode != 0 and "fails at epoch 2" in killed.stdout
    assert (files / "backup").is_dir()
    again = _run(tmp_path, child_env, "--epochs", "4", "--file_callbacks", str(files))
    assert again.returncode == 0, again.stdout[-6000:]
    ranks = [json.loads((tmp_path / f"out_{r}.json").read_text()) for r in range(2)]
    assert [r["epochs_run"] for r in ranks] == [[2, 3], [2, 3]]
    assert ranks[0]["weights"] == ranks[1]["weights"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_rank_that_raises_ends_its_whole_job_at_once(tmp_path, child_env):
    """Rank 1 alone raises between epochs while rank 0 goes on into the next step's
    collective: the launcher ends rank 0 too, well within 30 s of collective_timeout_s's 120."""
    start = time.monotonic()
    result = _run(tmp_path, child_env, "--epochs", "3", "--raise_on_rank", "1")
    took = time.monotonic() - start
    assert result.returncode != 0 and "rank 1 fails at epoch 1" in result.stdout
    assert took < 90, f"the job took {took:.0f} s to end"  # start-up included
