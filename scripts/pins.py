"""Print pinned requirement strings from setup.cfg, the project's one list of pins.

Usage: python scripts/pins.py NAME [NAME ...]   e.g. `pins.py horovod tensorflow-cpu`
Prints one requirement per line (e.g. `horovod==0.28.1`); exits 2 on an unknown name so
the install script fails loudly instead of installing an unpinned package.
"""
from __future__ import annotations

import configparser
import pathlib
import re
import sys

SETUP_CFG = pathlib.Path(__file__).resolve().parent.parent / "setup.cfg"


def all_requirements() -> dict[str, str]:
    """Map of normalised package name -> requirement string, from install_requires and extras."""
    cfg = configparser.ConfigParser()
    cfg.read(SETUP_CFG)
    lines = cfg["options"]["install_requires"].splitlines()
    for _, value in cfg["options.extras_require"].items():
        lines += value.splitlines()
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
            print(f"pins.py: {name!r} is not pinned in {SETUP_CFG}", file=sys.stderr)
            return 2
        print(reqs[name.lower()])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
