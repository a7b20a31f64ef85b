"""Reading and writing the planner's small JSON records (job stats, job profiles).

Records are given either as JSON text or as a file path, so a caller can pass what it has.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import Any, Iterator, Mapping, TypeVar

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


class InputFileError(ValueError):
    """A file given to the planner (a job's profile or stats, a contention record) that cannot
    be what it should be; the message names the file and what is wrong in one line, so a
    command line prints it instead of a traceback."""


@contextlib.contextmanager
def naming_the_file(path: str | os.PathLike) -> Iterator[None]:
    """Turns a failure to read or check the record at ``path`` into an InputFileError that
    names the file."""
    try:
        yield
    except InputFileError:
        raise
    except (OSError, ValueError, TypeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise InputFileError(f"{os.fspath(path)}: {reason}") from error


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


class JsonResult:
    """Mixin for a dataclass a caller only writes out (the planner's predictions and plans,
    which a scheduler reads as JSON): ``to_dict`` and ``to_json``, dumped with ``json_style``
    (keyword arguments of json.dumps)."""

    json_style: dict[str, Any] = {}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """Serialises the record; also writes it to ``path`` when given."""
        return write_text(json.dumps(self.to_dict(), **self.json_style), path)


class JsonRecord(JsonResult):
    """Mixin for a dataclass kept as one JSON object (job stats, job profiles), read back too.

    A subclass names what it is (``record_kind``, for messages) and which field names an
    instance (``name_field``).
    """

    record_kind = "record"
    name_field = "name"

    @classmethod
    def from_dict(cls: type[Record], data: Mapping[str, Any]) -> Record:
        return record_from_dict(cls, data, cls.record_kind, cls.name_field)

    @classmethod
    def from_json(cls: type[Record], text_or_path: str | os.PathLike) -> Record:
        """Reads a record from a JSON string or from a file path."""
        return cls.from_dict(loads_text_or_file(text_or_path, cls.record_kind))
