"""Renders docs/results.json into README.md's results table and docs/measurements.md's summary
table, between marker comments, so that each measured figure is written once: in the records.

Usage: python scripts/render_results.py           rewrites the two blocks from the records
       python scripts/render_results.py --check   exits 1, naming the page, if a block differs

Why: the same run's figures were typed into several pages and drifted apart (issue 63);
tests/unit/test_results_record.py fails when a block differs from what this renders.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any, Callable, Iterable

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results.json"
BEGIN = ("<!-- results: {name} (rendered from docs/results.json by scripts/render_results.py: "
         "edit the records, then run it) -->")
END = "<!-- /results: {name} -->"
BACKENDS = {"horovod": "Horovod", "tensorflow": "TensorFlow's collectives"}
HEADLINE = ("crossover_turn/naive", "crossover/naive")

Record = dict[str, Any]


def load(path: pathlib.Path = RESULTS) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def ratio_text(ratio: Record | None) -> str:
    """median [95% low–high], call; a ratio measured without a median shows its min–max."""
    if not ratio:
        return "—"
    text = ratio.get("median") or f"{ratio['min']}–{ratio['max']} over the trials"
    if "low" in ratio:
        text += f" [{ratio['low']}–{ratio['high']}]"
    return text + (f", {ratio['call']}" if ratio.get("call") else "")


def comm_to_compute_text(record: Record) -> str:
    ratio = record["comm_to_compute"]
    return ratio.get("median") or f"{ratio['min']}–{ratio['max']}"


def run_text(record: Record) -> str:
    backend = BACKENDS.get(record["backend"], record["backend"])
    period = f", T_B/T_A {record['period_ratio']}" if "period_ratio" in record else ""
    return f"{record['kind']}, {backend}{period}"


def _ms(value: str | Record) -> str:
    if isinstance(value, dict):
        return f"{_ms(value['min'])}–{_ms(value['max'])}"
    return f"{float(value):.0f}"


def jobs_text(record: Record) -> str:
    """Each job's C / M in whole ms (the records hold them as reported)."""
    return ", ".join(f"{job} " + " / ".join(_ms(times[key]) for key in ("compute_ms", "comm_ms")
                                             if key in times)
                     for job, times in record.get("jobs", {}).items()) or "—"


def _table(header: list[str], rows: Iterable[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])


def _runs(records: list[Record]) -> list[list[Record]]:
    """Records grouped by run (one per point of a sweep or a probe), in the file's order."""
    groups: dict[tuple, list[Record]] = {}
    for record in records:
        key = tuple(record.get(k) for k in ("date", "commit", "kind", "backend", "machine"))
        groups.setdefault(key, []).append(record)
    return list(groups.values())


def _joined(points: list[Record], cell: Callable[[Record], str]) -> str:
    return " / ".join(dict.fromkeys(cell(point) for point in points))


def readme_table(results: dict[str, Any]) -> str:
    """The README's short table: gain over naive by M/C, backend and machine, a row a run."""
    rows = [[points[0]["date"], points[0]["commit"] or "—",
             results["machines"][points[0]["machine"]]["name"], run_text(points[0]),
             _joined(points, comm_to_compute_text),
             _joined(points, jobs_text),
             *(_joined(points, lambda p, name=name: ratio_text(p["ratios"].get(name)))
               for name in HEADLINE)]
            for points in _runs([r for r in results["runs"] if r["readme"]])]
    return _table(["date", "commit", "machine", "run", "M/C", "C / M (ms)",
                   "link turns / naive [95%]", "crossing / naive [95%]"], rows)


def summary_table(results: dict[str, Any]) -> str:
    """docs/measurements.md's summary: every record, a row each, linked to its section."""
    def row(record: Record) -> list[str]:
        others = [f"{name} {ratio_text(ratio)}" for name, ratio in record["ratios"].items()
                  if name not in HEADLINE]
        return [record["date"], record["commit"] or "—",
                results["machines"][record["machine"]]["name"],
                f"[{run_text(record)}](#{record['section']})", comm_to_compute_text(record),
                jobs_text(record), *(ratio_text(record["ratios"].get(n)) for n in HEADLINE),
                "; ".join([*others, *filter(None, [record.get("note")])]) or "—",
                record.get("minutes", "—")]
    return _table(["date", "commit", "machine", "run", "M/C", "C / M (ms)",
                   "link turns / naive [95%]", "crossing / naive [95%]",
                   "other ratios; notes", "minutes"], map(row, results["runs"]))


PAGES: dict[str, tuple[pathlib.Path, Callable[[dict[str, Any]], str]]] = {
    "readme": (ROOT / "README.md", readme_table),
    "summary": (ROOT / "docs" / "measurements.md", summary_table),
}


def block_span(text: str, name: str) -> tuple[int, int]:
    """Where block name's rendered text lies in text (between its markers' lines)."""
    begin, end = BEGIN.format(name=name), END.format(name=name)
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"block {name!r}: expected one {begin!r} line before one {end!r}")
    return text.index(begin) + len(begin) + 1, text.index(end)


def rendered(text: str, name: str, results: dict[str, Any]) -> str:
    """text with block name rendered anew from results."""
    start, stop = block_span(text, name)
    return text[:start] + PAGES[name][1](results) + "\n" + text[stop:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 on a "
                        "block that differs from the records")
    args = parser.parse_args(argv)
    results, stale = load(), []
    for name, (path, _) in PAGES.items():
        text = path.read_text(encoding="utf-8")
        try:
            new = rendered(text, name, results)
        except ValueError as error:
            print(f"{path.relative_to(ROOT)}: {error}", file=sys.stderr)
            return 2
        if new != text:
            stale.append(str(path.relative_to(ROOT)))
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if stale:
        print(("differs from docs/results.json: " if args.check else "rewrote: ")
              + ", ".join(stale))
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
