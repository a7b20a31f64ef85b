"""Nest helpers the step code shares."""
from __future__ import annotations

from typing import Any, Callable, Sequence


def map_present(op: Callable[[list[Any]], Sequence[Any]],
                items: Sequence[Any | None]) -> list[Any | None]:
    """Applies a list-to-list op to the non-None items, keeping None in place (variables
    without gradients pass through collectives and lease ops untouched)."""
    present = [i for i, item in enumerate(items) if item is not None]
    out = list(items)
    for i, result in zip(present, op([items[i] for i in present])):
        out[i] = result
    return out
