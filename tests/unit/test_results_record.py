"""docs/results.json is the one source of the measured figures the README and docs/
measurements.md's summary state (issue 63: the same run's figures drifted apart between pages).

The rendered tables must equal what scripts/render_results.py makes of the records, and every
decimal figure those pages state (1.048, or a range such as 0.995–1.087) must be one the
records hold: a value, or a pair that one record holds as its 95% interval or min–max, or the
range of one ratio's medians over one run's points (the GPU probe's M/C 0.5, 1 and 2).
"""
from __future__ import annotations

import decimal
import importlib.util
import json
import re
from typing import Any, Iterator

import pytest

from conftest import REPO_ROOT

_spec = importlib.util.spec_from_file_location("render_results",
                                               REPO_ROOT / "scripts" / "render_results.py")
render_results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_results)

README = REPO_ROOT / "README.md"
MEASUREMENTS = REPO_ROOT / "docs" / "measurements.md"
NUMBER = r"\d+\.\d+"
_RANGE = re.compile(rf"(?<![\w.])({NUMBER})\s*[–-]\s*({NUMBER})(?![\w.]*\d)")
_SINGLE = re.compile(rf"(?<![\w.])({NUMBER})(?![\w]|\.\d)")
# A decimal right after a product's name is its version (TensorFlow 2.21), not a figure.
_VERSION = re.compile(r"(Python|TensorFlow|Keras|Horovod|tensorflow|keras|arXiv|CUDA)"
                      r"[\s=<>~-]*$")
# Text that states no figure: code (fenced and inline), HTML comments and link targets.
_NOT_PROSE = re.compile(r"^\s*(`{3,}).*?^\s*\1\s*$|`[^`\n]+`|<!--.*?-->|\]\([^)]*\)",
                        re.S | re.M)
CALLS = {"win", "tie", "too close to call", None}


def _walk(node: Any) -> Iterator[Any]:
    """node and everything inside it: the records' dicts and their strings."""
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for child in children:
        yield from _walk(child)


def held(results: dict[str, Any]) -> tuple[set[decimal.Decimal], set[tuple]]:
    """The figures the records hold, as numbers (1.30 is 1.3), and the ranges."""
    nodes = list(_walk(results["runs"]))
    values = {decimal.Decimal(n) for n in nodes if isinstance(n, str) and re.fullmatch(NUMBER, n)}
    pairs = {(decimal.Decimal(n[low]), decimal.Decimal(n[high])) for n in nodes
             if isinstance(n, dict) for low, high in (("low", "high"), ("min", "max"))
             if isinstance(n.get(low), str) and isinstance(n.get(high), str)}
    runs: dict[tuple, list[dict[str, Any]]] = {}
    for record in results["runs"]:
        key = (record["date"], record["commit"], record["kind"], record["backend"])
        runs.setdefault(key, []).append(record)
    for points in runs.values():
        for name in {n for p in points for n in p["ratios"]}:
            medians = [decimal.Decimal(p["ratios"][name]["median"]) for p in points
                       if "median" in p["ratios"].get(name, {})]
            if len(medians) > 1:
                pairs.add((min(medians), max(medians)))
    return values, pairs


def unrecorded_figures(text: str, results: dict[str, Any]) -> list[str]:
    """The decimal figures of text's prose that the records do not hold."""
    values, pairs = held(results)
    prose = _NOT_PROSE.sub(" ", text)
    wrong, spans = [], []
    for found in _RANGE.finditer(prose):
        spans.append(found.span())
        if tuple(map(decimal.Decimal, found.groups())) not in pairs:
            wrong.append(found.group())
    for found in _SINGLE.finditer(prose):
        inside = any(start <= found.start() < end for start, end in spans)
        if not inside and not _VERSION.search(prose[max(0, found.start() - 20):found.start()]) \
                and decimal.Decimal(found.group(1)) not in values:
            wrong.append(found.group())
    return wrong


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading (as tests/system/test_doc_snippets.py computes it)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _summary(text: str) -> str:
    """docs/measurements.md's summary: everything before its first section."""
    return text.split("\n## ", 1)[0]


def test_rendered_blocks_equal_the_records() -> None:
    results = render_results.load()
    for name, (path, _) in render_results.PAGES.items():
        text = path.read_text(encoding="utf-8")
        assert render_results.rendered(text, name, results) == text, (
            f"{path.name}'s {name!r} table differs from docs/results.json: "
            "run python scripts/render_results.py")


@pytest.mark.parametrize("page", ["README.md", "docs/measurements.md (summary)"])
def test_pages_state_only_recorded_figures(page: str) -> None:
    text = README.read_text(encoding="utf-8") if page == "README.md" else \
        _summary(MEASUREMENTS.read_text(encoding="utf-8"))
    wrong = unrecorded_figures(text, render_results.load())
    assert not wrong, (f"{page} states figures docs/results.json does not hold (add the run's "
                       f"record, or correct the text): {wrong}")


def test_a_figure_or_a_range_no_record_holds_is_caught() -> None:
    """The check itself: a mistyped figure, and two true ends of different records' intervals,
    are caught; versions, code and true ranges are not."""
    results = render_results.load()
    assert unrecorded_figures("link turns 1.048 [95% 0.995–1.087], a tie", results) == []
    assert unrecorded_figures("link turns 1.049 [95% 0.895–1.087]", results) == \
        ["0.895–1.087", "1.049"]
    assert unrecorded_figures("TensorFlow 2.21, `--bandwidth_mbit=12.34`, 1.30–1.55", results) \
        == []


def test_records_are_well_formed() -> None:
    """Each record names its date, machine, section and calls, and every figure is a decimal
    string (its digits the reported precision)."""
    results = render_results.load()
    anchors = {_anchor(h) for h in
               re.findall(r"^#+\s+(.*)$", MEASUREMENTS.read_text(encoding="utf-8"), re.M)}
    for record in results["runs"]:
        where = f"{record['date']} {record['commit']} {record['backend']}"
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", record["date"]), where
        assert record["machine"] in results["machines"], where
        assert record["section"] in anchors, (where, record["section"])
        assert isinstance(record["readme"], bool) and record["ratios"], where
        for ratio in record["ratios"].values():
            assert ratio.get("call") in CALLS, (where, ratio)
            assert set(ratio) <= {"median", "min", "max", "low", "high", "call"}, (where, ratio)
            assert "median" in ratio or {"min", "max"} <= set(ratio), (where, ratio)
            assert all(re.fullmatch(NUMBER, ratio[k]) for k in ratio if k != "call"), where


def test_the_reports_reference_run_is_a_record() -> None:
    """docs/readme_run.json (the run every compare.md measures its machine against) is one of
    the records, with the same C and M, so the report's line and the tables agree."""
    reference = json.loads((REPO_ROOT / "docs" / "readme_run.json").read_text())
    match = [r for r in render_results.load()["runs"]
             if (r["date"], r["commit"], r["backend"]) ==
             (reference["date"], reference["commit"], reference["backend"])]
    assert len(match) == 1, reference
    for job, times in match[0]["jobs"].items():
        assert float(times["compute_ms"]) == reference["compute_ms"][job], job
        assert float(times["comm_ms"]) == reference["comm_ms"][job], job
