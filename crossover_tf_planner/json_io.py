"""Reading and writing the planner's small JSON records (job stats, job profiles).

Records are given either as JSON text or as a file path, so a caller can pass what it has.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping, TypeVar

Record = TypeVar("Record", bound="JsonRecord")


def loads_text_or_file(text_or_path: str | os.PathLike, what: str) -> Any:
    """Parses JSON text, or the file at a path (anything not starting with '{')."""
    text = str(text_or_path)
    if not text.lstrip().startswith("{"):
        with open(text_or_path, encoding="utf-8") as handle:
            text = handle.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{what} is not valid JSON: {error}") from error


def write_text(text: str, path: str | os.PathLike | None) -> str:
    """Writes text (plus a newline) to path when one is given; returns the text."""
    if path is not None:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    return text


def record_from_dict(cls: type[Record], data: Mapping[str, Any], what: str,
                     name_field: str) -> Record:
    """Builds dataclass ``cls`` from a JSON object, naming missing required fields (those
    without a default) and unknown ones, so a stale or hand-edited file fails clearly."""
    if not isinstance(data, Mapping):
        raise ValueError(f"a {what} must be a JSON object, got {type(data).__name__}")
    fields = dataclasses.fields(cls)
    required = [f.name for f in fields if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]
    missing = [name for name in required if name not in data]
    if missing:
        raise ValueError(f"{what} {data.get(name_field, '?')!r} is missing required "
                         f"field(s): {', '.join(missing)}")
    unknown = sorted(set(data) - {f.name for f in fields})
    if unknown:
        raise ValueError(f"{what} {data.get(name_field)!r} has unknown field(s): "
                         f"{', '.join(unknown)}")
    return cls(**dict(data))


class JsonRecord:
    """Mixin for a dataclass kept as one JSON object (job stats, job profiles).

    A subclass names what it is (``record_kind``, for messages), which field names an instance
    (``name_field``) and how it is dumped (``json_style``, keyword arguments of json.dumps).
    """

    record_kind = "record"
    name_field = "name"
    json_style: dict[str, Any] = {}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """Serialises the record; also writes it to ``path`` when given."""
        return write_text(json.dumps(self.to_dict(), **self.json_style), path)

    @classmethod
    def from_dict(cls: type[Record], data: Mapping[str, Any]) -> Record:
        return record_from_dict(cls, data, cls.record_kind, cls.name_field)

    @classmethod
    def from_json(cls: type[Record], text_or_path: str | os.PathLike) -> Record:
        """Reads a record from a JSON string or from a file path."""
        return cls.from_dict(loads_text_or_file(text_or_path, cls.record_kind))
