"""Per-step allreduce phases from Horovod's timeline (HOROVOD_TIMELINE, written by rank 0).

The timeline is chrome://tracing JSON in which every tensor is a "process" (pid) with
begin/end events: NEGOTIATE_ALLREDUCE (from the first rank asking to every rank being ready:
waiting for the slowest rank), then the top-level ALLREDUCE holding activities such as QUEUE,
MEMCPY_IN_FUSION_BUFFER and GLOO_ALLREDUCE (the transfer and reduction). Each gradient is
reduced once per step, so a tensor's k-th ALLREDUCE belongs to step k; tensors reduced a
different number of times (metrics) are left out.

Pure Python on the saved file; see horovod/common/timeline.cc for the format.
"""
from __future__ import annotations

import collections
import json
import pathlib
import statistics
from typing import Any

NEGOTIATE = "NEGOTIATE_ALLREDUCE"
ALLREDUCE = "ALLREDUCE"
TRANSFER = "GLOO_ALLREDUCE"


def load_events(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """The trace's events; a file cut short by a killed process loses its last event only."""
    text = pathlib.Path(path).read_text().strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(text[:text.rfind("}") + 1] + "]")


def spans(events: list[dict[str, Any]]) -> dict[int, list[tuple[str, float, float]]]:
    """(name, begin µs, end µs) of every begin/end pair, per tensor (pid), in order."""
    open_spans: dict[int, list[tuple[str, float]]] = collections.defaultdict(list)
    out: dict[int, list[tuple[str, float, float]]] = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "B":
            open_spans[e["pid"]].append((e["name"], float(e["ts"])))
        elif e.get("ph") == "E" and open_spans[e["pid"]]:
            name, begin = open_spans[e["pid"]].pop()
            out[e["pid"]].append((name, begin, float(e["ts"])))
    return out


def step_phases(events: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per step, in ms: negotiate (first tensor asked -> all ranks ready for the last one;
    0 when the ranks arrived in the same Horovod cycle), allreduce (the fused reductions, first
    begin -> last end), transfer (GLOO_ALLREDUCE time, union over tensors) and total (first
    ask -> last tensor reduced)."""
    per_step = _per_step(spans(events))
    rows = []
    for negotiate, reduce, transfer in per_step:
        first = min(b for b, _ in negotiate + reduce)
        rows.append({
            "negotiate_ms": (max(e for _, e in negotiate) - first) / 1e3 if negotiate else 0.0,
            "allreduce_ms": (max(e for _, e in reduce) - min(b for b, _ in reduce)) / 1e3,
            "transfer_ms": _union_ms(transfer),
            "total_ms": (max(e for _, e in reduce) - first) / 1e3})
    return rows


Span = tuple[float, float]


def _per_step(per_tensor: dict[int, list[tuple[str, float, float]]]
              ) -> list[tuple[list[Span], list[Span], list[Span]]]:
    """(negotiations, reductions, transfers) of every step: a tensor's k-th ALLREDUCE, the
    negotiation that ended just before it and the transfers inside it."""
    counts = collections.Counter(sum(name == ALLREDUCE for name, _, _ in s)
                                 for s in per_tensor.values())
    counts.pop(0, None)  # tensors only broadcast or gathered (the initial weights)
    if not counts:
        return []
    # The gradients: the reduction count that covers the most reductions (not a metric
    # averaged once at the end, nor a tensor reduced once to line the ranks up).
    steps = max(counts, key=lambda n: n * counts[n])
    out: list[tuple[list[Span], list[Span], list[Span]]] = [([], [], []) for _ in range(steps)]
    for tensor_spans in per_tensor.values():
        ordered = sorted(tensor_spans, key=lambda s: s[1])
        reductions = [(b, e) for name, b, e in ordered if name == ALLREDUCE]
        if len(reductions) != steps:
            continue  # not a per-step gradient (e.g. a metric averaged once)
        previous_end = float("-inf")
        for k, (begin, end) in enumerate(reductions):
            negotiations = [(b, e) for name, b, e in ordered
                            if name == NEGOTIATE and previous_end <= b and e <= begin + 1]
            out[k][0].extend(negotiations[-1:])
            out[k][1].append((begin, end))
            out[k][2].extend((b, e) for name, b, e in ordered
                             if name == TRANSFER and begin <= b <= end)
            previous_end = end
    return out


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for b, e in sorted(intervals):
        if e > end:
            total += e - max(b, end)
            end = e
    return total / 1e3


def summary(path: str | pathlib.Path, skip_steps: int) -> dict[str, float]:
    """Median of each step phase after the first `skip_steps` (warm-up) steps."""
    rows = step_phases(load_events(path))[skip_steps:]
    if not rows:
        raise ValueError(f"{path}: no allreduce steps after {skip_steps} warm-up steps")
    return {key: statistics.median(r[key] for r in rows) for key in rows[0]}
