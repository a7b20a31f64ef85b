"""The op library loader's TensorFlow version check, against fake build records (no rebuild)."""
from __future__ import annotations

import json
import pathlib

import pytest
import tensorflow as tf

from crossover_tf.lease import loader


def fake_library(tmp_path: pathlib.Path, record: str | None) -> pathlib.Path:
    """An empty stand-in for _lease_ops.so, with `record` as its build record (None: none).
    TensorFlow cannot load it, so a test that gets past the check fails loudly."""
    library = tmp_path / loader.LIBRARY_NAME
    library.write_bytes(b"")
    if record is not None:
        loader.build_record_path(library).write_text(record)
    return library


def test_build_record_sits_beside_the_library():
    assert loader.build_record_path(pathlib.Path("/x/_lease_ops.so")) == pathlib.Path(
        "/x/_lease_ops.build.json")


def test_mismatch_names_both_versions(tmp_path):
    library = fake_library(tmp_path, json.dumps({"tensorflow": "2.20.0"}))
    with pytest.raises(loader.TensorFlowVersionMismatch) as err:
        loader.check_built_for(library, running="2.21.0")
    message = str(err.value)
    assert "built against TensorFlow 2.20.0" in message
    assert "runs TensorFlow 2.21.0" in message
    assert "--no-build-isolation" in message


def test_matching_or_missing_record_passes(tmp_path):
    loader.check_built_for(fake_library(tmp_path, json.dumps({"tensorflow": "2.21.0"})),
                           running="2.21.0")
    other = tmp_path / "bazel"
    other.mkdir()
    loader.check_built_for(fake_library(other, None), running="2.21.0")  # Bazel: no record


def test_unreadable_record_is_a_clear_error(tmp_path):
    with pytest.raises(loader.TensorFlowVersionMismatch, match="unreadable build record"):
        loader.check_built_for(fake_library(tmp_path, "not json"), running="2.21.0")


def test_load_library_refuses_a_mismatch_before_loading(tmp_path, monkeypatch):
    """The check runs before tf.load_op_library, which could crash on a foreign C++ ABI."""
    library = fake_library(tmp_path, json.dumps({"tensorflow": "1.15.0"}))
    monkeypatch.setenv("CROSSOVER_LEASE_OPS", str(library))
    with pytest.raises(loader.TensorFlowVersionMismatch, match=f"runs TensorFlow {tf.__version__}"):
        loader.load_library.__wrapped__()   # bypasses the cache of the real library


def test_installed_library_matches_this_tensorflow():
    """The library this checkout loads was built for the TensorFlow it runs, where recorded."""
    for path in loader.LIBRARY_CANDIDATES:
        if path.exists():
            loader.check_built_for(path)
