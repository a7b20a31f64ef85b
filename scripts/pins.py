"""Print pinned requirement strings from pyproject.toml, the project's one list of pins.

Usage: python scripts/pins.py NAME [NAME ...]   e.g. `pins.py horovod tensorflow-cpu`
Prints one requirement per line (e.g. `horovod==0.28.1`); exits 2 on an unknown name so
the install script fails loudly instead of installing an unpinned package.
"""
from __future__ import annotations

import pathlib
import re
import sys
import tomllib

PYPROJECT = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"


def all_requirements() -> dict[str, str]:
    """Map of normalised package name -> requirement string, from the dependencies and the
    optional dependencies."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines += extra
    reqs = {}
    for line in (raw.strip() for raw in lines):
        if line:
            name = re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0].lower()
            reqs[name] = line
    return reqs


def main(names: list[str]) -> int:
    reqs = all_requirements()
    for name in names:
        if name.lower() not in reqs:
            print(f"pins.py: {name!r} is not pinned in {PYPROJECT}", file=sys.stderr)
            return 2
        print(reqs[name.lower()])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
