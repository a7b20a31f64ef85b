"""Runs the code blocks of README.md and docs/*.md, so that examples cannot rot.

Why: a README example that stopped working is worse than none, and nobody re-reads docs after
a rename. Every fenced block is either run here (with small settings) or says, next to it, why
not; the cheap tests also check that the modules and files the text names exist.

Marker syntax. The last non-blank line before a fence may be one HTML comment (invisible on
GitHub) that says how the block is tested:

    <!-- snippet: DIRECTIVE; DIRECTIVE; ... -->

    skip (REASON)              not run here: too long (the main job, the full suite) or it
                               changes shared state (rebuilds the op in place). REASON is
                               required: what it costs and what runs it instead, a test or
                               script named by its path (tests/..., scripts/..., .ci/run).
    cannot-run-here (REASON)   needs what this machine lacks (GPU, Kubernetes, Docker, root,
                               several users). REASON is required.
    name NAME                  names the block for `after` (within the same file).
    after NAME                 block NAME of the same file runs first, in the same directory
                               (e.g. it writes the files this block reads).
    replace "OLD" => "NEW"     small settings: OLD (which must occur) is replaced by NEW in the
                               text that runs; an optional "(note)" may follow.
    env KEY=VALUE ...          added to the block's environment.
    timeout SECONDS            hard limit for the block (default 180).
    exit STATUS                the exit status the block must end with (default 0).
    expect "TEXT"              its output (stdout and stderr together) must contain TEXT.

Languages: ```python blocks run as a script, ```bash/```sh/```shell blocks with `bash -e -o
pipefail`; ```text, ```json (which must parse) and ```yaml blocks are shown, not run. Any
other language, or none, needs a skip or cannot-run-here marker.

Each block runs in a fresh directory holding links to the repository's top-level entries (so
`scripts/...` and `tests/data/...` resolve and outputs such as runs/ stay out of the
repository), with PYTHONPATH at the repository root, the venv's bin first on PATH, TensorFlow
quiet, and CROSSOVER_LEASE_DIR set to a lease directory of its own (no two runs share a
lease). Blocks that need a peer job are written for two and run alone with `replace "jobs=2"
=> "jobs=1"`.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import pathlib
import re
import shlex
import sys
import unicodedata

import pytest

from conftest import REPO_ROOT, run_bounded

DOC_FILES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
RUNNERS = {"python": ["python"], "bash": ["bash", "-e", "-o", "pipefail"]}
LANGUAGE_ALIASES = {"py": "python", "python3": "python", "sh": "bash", "shell": "bash"}
SHOWN_ONLY = {"text", "json", "yaml"}
NOT_RUN = {"skip", "cannot-run-here"}
DEFAULT_TIMEOUT_S = 180.0
# Top-level names in text that are outputs or local state, not repository paths.
NOT_REPO_ROOTS = {"runs", "build", "dist"}
# Commands that never run inside the suite: the main job (30 minutes), the shift experiment (60)
# and the suite itself, which would run this file again, inside itself. A block naming one must
# carry a marker.
NEVER_INSIDE_THE_SUITE = ("scripts/run_main.sh", "scripts/run_shift.sh", "scripts/test.sh",
                          "pytest")
INSIDE_A_SNIPPET = "CROSSOVER_DOC_SNIPPET"  # set for every block: no nested snippet runs
# Where a skipped block's command runs instead: a file under one of these (its reason names it).
COVERING_ROOTS = ("tests/", "scripts/", ".ci/")

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
_MARKER = re.compile(r"^\s*<!--\s*snippet:(?P<body>.*?)-->\s*$")
_QUOTED = r'"((?:[^"\\]|\\.)*)"'
_REPLACE = re.compile(rf"^replace\s+{_QUOTED}\s*=>\s*{_QUOTED}\s*(\(.*\))?$")
_EXPECT = re.compile(rf"^expect\s+{_QUOTED}$")
_REASON = re.compile(r"^(skip|cannot-run-here)\s*\((?P<reason>.*)\)$", re.S)
_PYTHON_M = re.compile(r"\bpython3?\s+-m\s+([A-Za-z_][\w.]*)")
_PATH_TOKEN = re.compile(r"[A-Za-z0-9_.][\w./-]*/[\w./-]*")
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclasses.dataclass
class Marker:
    """What a block's `<!-- snippet: ... -->` comment says (see the module docstring)."""
    not_run: str = ""               # "skip" or "cannot-run-here"
    reason: str = ""
    name: str = ""
    after: list[str] = dataclasses.field(default_factory=list)
    replacements: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    exit_status: int = 0
    expect: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Block:
    """One fenced code block, where it is, and how it is tested."""
    path: pathlib.Path
    line: int                       # 1-based line of the opening fence
    language: str
    code: str
    marker: Marker | None
    problems: list[str]             # a malformed marker: reported by the cheap test

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT)}:{self.line}"

    @property
    def runs_here(self) -> bool:
        return self.language in RUNNERS and not (self.marker and self.marker.not_run)

    def code_to_run(self) -> str:
        code = self.code
        for old, new in self.marker.replacements if self.marker else []:
            code = code.replace(old, new)
        return code


def _unquote(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def _split_directives(body: str) -> list[str]:
    """Splits on ';' outside quotes and parentheses (reasons may contain either)."""
    parts, current, depth, quoted = [], [], 0, False
    for i, char in enumerate(body):
        escaped = i > 0 and body[i - 1] == "\\"
        if char == '"' and not escaped:
            quoted = not quoted
        elif not quoted and char in "()":
            depth += 1 if char == "(" else -1
        if char == ";" and not quoted and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def parse_marker(body: str) -> tuple[Marker, list[str]]:
    """The marker's directives, and what is wrong with them (empty when nothing is)."""
    marker, problems = Marker(), []
    for directive in _split_directives(body):
        word, _, rest = directive.partition(" ")
        rest = rest.strip()
        if word.startswith(tuple(NOT_RUN)):
            found = _REASON.match(directive)
            if not found or not found["reason"].strip():
                problems.append(f"{directive!r}: skip and cannot-run-here need a (reason)")
            else:
                marker.not_run, marker.reason = found[1], found["reason"].strip()
        elif word in ("name", "after") and re.fullmatch(r"[\w-]+", rest):
            if word == "name":
                marker.name = rest
            else:
                marker.after.append(rest)
        elif word == "replace" and (found := _REPLACE.match(directive)):
            marker.replacements.append((_unquote(found[1]), _unquote(found[2])))
        elif word == "env" and rest and all("=" in item for item in shlex.split(rest)):
            marker.env.update(item.split("=", 1) for item in shlex.split(rest))
        elif word in ("timeout", "exit") and re.fullmatch(r"\d+(\.\d+)?", rest):
            if word == "timeout":
                marker.timeout_s = float(rest)
            else:
                marker.exit_status = int(float(rest))
        elif word == "expect" and (found := _EXPECT.match(directive)):
            marker.expect.append(_unquote(found[1]))
        else:
            problems.append(f"unknown or malformed directive {directive!r}")
    return marker, problems


def extract_blocks(path: pathlib.Path) -> tuple[list[Block], list[str]]:
    """The file's fenced blocks, and markers that precede no block (a typo would otherwise
    silently untest the block it was meant for)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    orphans: list[str] = []
    pending: tuple[int, str] | None = None  # (line, body) of a marker awaiting its fence
    i = 0
    while i < len(lines):
        line = lines[i]
        if found := _MARKER.match(line):
            if pending is not None:
                orphans.append(f"{path.name}:{pending[0]}")
            pending = (i + 1, found["body"])
            i += 1
            continue
        fence = _FENCE.match(line)
        if not fence:
            if line.strip() and pending is not None:
                orphans.append(f"{path.name}:{pending[0]}")
                pending = None
            i += 1
            continue
        indent, ticks = len(fence["indent"]), fence["fence"]
        close = re.compile(rf"^\s*{re.escape(ticks[0])}{{{len(ticks)},}}\s*$")
        end = i + 1
        while end < len(lines) and not close.match(lines[end]):
            end += 1
        # A fence indented in a list item: its lines lose that indent, and no more.
        body = "\n".join(text[indent:] if not text[:indent].strip() else text.lstrip()
                         for text in lines[i + 1:end]) + "\n"
        marker, problems = parse_marker(pending[1]) if pending else (None, [])
        language = fence["lang"].lower()
        blocks.append(Block(path, i + 1, LANGUAGE_ALIASES.get(language, language), body,
                            marker, problems))
        pending = None
        i = end + 1
    if pending is not None:
        orphans.append(f"{path.name}:{pending[0]}")
    return blocks, orphans


def all_blocks() -> list[Block]:
    return [block for path in DOC_FILES for block in extract_blocks(path)[0]]


BLOCKS = all_blocks()


def _named(block: Block, name: str) -> Block:
    for other in BLOCKS:
        if other.path == block.path and other.marker and other.marker.name == name:
            return other
    raise LookupError(f"{block.id}: `after {name}` names no block of {block.path.name}")


# ----- cheap checks (not slow) ---------------------------------------------------------------
def test_docs_exist_and_open_with_a_summary() -> None:
    """Each docs page opens with its three-line summary (the README links to them by it)."""
    for path in DOC_FILES[1:]:
        if path.name == "measured_history.md":
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        summary = [line for line in lines[1:6] if line.startswith("> ")]
        assert lines[0].startswith("# ") and len(summary) == 3, \
            f"{path.name}: a title, then a three-line '> ' summary"


def test_every_block_runs_here_or_says_why_not() -> None:
    problems = []
    for path in DOC_FILES:
        problems += [f"{o}: a snippet marker with no code block after it"
                     for o in extract_blocks(path)[1]]
    for block in BLOCKS:
        problems += [f"{block.id}: {p}" for p in block.problems]
        marker = block.marker
        if block.language not in RUNNERS and block.language not in SHOWN_ONLY \
                and not (marker and marker.not_run):
            problems.append(f"{block.id}: language {block.language or '(none)'!r} cannot run; "
                            "tag it python/bash/text/json or mark it skip/cannot-run-here")
        if block.language == "json":
            try:
                json.loads(block.code)
            except ValueError as error:
                problems.append(f"{block.id}: not JSON ({error})")
        if block.runs_here and any(c in block.code for c in NEVER_INSIDE_THE_SUITE):
            problems.append(f"{block.id}: runs the main job or the test suite; mark it "
                            "`skip (reason)`")
        for old, _ in marker.replacements if marker else []:
            if old not in block.code:
                problems.append(f"{block.id}: replace {old!r}, which the block no longer has")
        for name in marker.after if marker else []:
            try:
                _named(block, name)
            except LookupError as error:
                problems.append(str(error))
    assert not problems, "\n".join(problems)


def _covering_files(reason: str) -> list[str]:
    """The repository's tests and scripts that a skip reason names."""
    tokens = (token.rstrip(".,:;") for token in _PATH_TOKEN.findall(reason))
    return [t for t in tokens if t.startswith(COVERING_ROOTS) and (REPO_ROOT / t).is_file()]


def test_every_skipped_command_names_what_runs_it() -> None:
    """A command no test runs rots silently (issue 38: a documented benchmark did), so a
    `skip` block's reason names the test or script that runs its command in a short form.
    (`cannot-run-here` blocks need what no test machine has; their reason says what.)"""
    bare = [f"{block.id}: skip ({block.marker.reason})" for block in BLOCKS
            if block.marker and block.marker.not_run == "skip"
            and not _covering_files(block.marker.reason)]
    assert not bare, ("skip reasons that name no existing test or script running the command "
                      f"({', '.join(COVERING_ROOTS)}):\n" + "\n".join(bare))


def _repo_roots() -> set[str]:
    return {entry.name for entry in REPO_ROOT.iterdir()
            if not entry.name.startswith((".", "bazel-")) and entry.name not in NOT_REPO_ROOTS}


def _module_exists(module: str) -> bool:
    """Resolves `python -m module` without importing it: by file for the repository's own
    packages, by the top-level package's spec for everything else."""
    top = module.split(".")[0]
    if (REPO_ROOT / top).is_dir():
        base = REPO_ROOT.joinpath(*module.split("."))
        return base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()
    return importlib.util.find_spec(top) is not None


def _command_texts() -> list[tuple[str, str]]:
    """(where, text) of every shell block and every inline code span of the docs' prose."""
    texts = [(block.id, block.code) for block in BLOCKS if block.language not in SHOWN_ONLY]
    for path in DOC_FILES:
        prose = re.sub(r"^\s*(`{3,}|~{3,}).*?^\s*\1\s*$", "",
                       path.read_text(encoding="utf-8"), flags=re.S | re.M)
        texts += [(path.name, span) for span in _INLINE_CODE.findall(prose)]
    return texts


def test_named_modules_and_paths_exist() -> None:
    """Catches renames: `python -m X` and repository paths in commands and inline code."""
    roots, missing = _repo_roots(), []
    for where, text in _command_texts():
        missing += [f"{where}: python -m {m}" for m in _PYTHON_M.findall(text)
                    if not _module_exists(m)]
        for found in _PATH_TOKEN.finditer(text):
            if text[found.end():found.end() + 1] in ("{", "<", "*") \
                    or text[found.start() - 1:found.start()] in ("$", "{", "<", "/"):
                continue  # a pattern (ops/core/device_lease.{h,cc}) or a variable's path
            token = found.group().rstrip(".,:;")
            if token.startswith("./"):
                token = token[2:]
            if token.split("/")[0] in roots and not (REPO_ROOT / token).exists():
                missing.append(f"{where}: {token}")
    assert not missing, "named in the docs but not in the repository:\n" + "\n".join(missing)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = unicodedata.normalize("NFKC", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_links_between_pages_resolve() -> None:
    broken = []
    for path in DOC_FILES:
        for target in _LINK.findall(path.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked offline
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                broken.append(f"{path.name}: {target}")
            elif anchor and linked.suffix == ".md":
                headings = re.findall(r"^#+\s+(.*)$", linked.read_text(encoding="utf-8"),
                                      flags=re.M)
                if anchor not in {_anchor(h) for h in headings}:
                    broken.append(f"{path.name}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_marker_parser() -> None:
    """The syntax the docs rely on: reasons required, quoted replacements, unknown refused."""
    marker, problems = parse_marker(
        ' replace "jobs=2" => "jobs=1" (alone); env A=1 B="x y"; timeout 30; exit 2;'
        ' expect "a; b"; name first; after zero ')
    assert not problems
    assert marker.replacements == [("jobs=2", "jobs=1")] and marker.env == {"A": "1",
                                                                             "B": "x y"}
    assert (marker.timeout_s, marker.exit_status, marker.expect) == (30.0, 2, ["a; b"])
    assert (marker.name, marker.after) == ("first", ["zero"])
    assert parse_marker(" skip (long; see CI)")[0].reason == "long; see CI"
    for bad in (" skip", " skip ()", " cannot-run-here", " frobnicate", " timeout soon"):
        assert parse_marker(bad)[1], bad


# ----- running the blocks (slow) -------------------------------------------------------------
@pytest.fixture
def sandbox(tmp_path: pathlib.Path) -> pathlib.Path:
    """A directory that looks like the repository's root but writes nowhere in it."""
    for entry in REPO_ROOT.iterdir():
        if entry.name not in NOT_REPO_ROOTS and not entry.name.startswith((".git", "bazel-")):
            (tmp_path / entry.name).symlink_to(entry)
    (tmp_path / "lease").mkdir()
    return tmp_path


def _environment(sandbox: pathlib.Path, marker: Marker | None) -> dict[str, str]:
    venv_bin = pathlib.Path(sys.executable).parent
    shims = sandbox / ".shims"
    shims.mkdir(exist_ok=True)
    if not (venv_bin / "crossover-plan").exists():
        # A venv installed before the console script existed: the same entry point by -m.
        shim = shims / "crossover-plan"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m crossover_tf_planner "$@"\n')
        shim.chmod(0o755)
    env = dict(os.environ)
    env.update(PYTHONPATH=str(REPO_ROOT), TF_CPP_MIN_LOG_LEVEL="2", PYTHONDONTWRITEBYTECODE="1",
               PATH=os.pathsep.join([str(venv_bin), str(shims), env.get("PATH", "")]),
               CROSSOVER_LEASE_DIR=str(sandbox / "lease"), **{INSIDE_A_SNIPPET: "1"})
    env.update(marker.env if marker else {})
    return env


def run_block(block: Block, sandbox: pathlib.Path, seen: tuple[str, ...] = ()) -> str:
    """Runs block (after the blocks it names) in sandbox; fails the test unless it ends as
    its marker says. Returns its output."""
    if block.id in seen:
        pytest.fail(f"{block.id}: `after` chain loops: {' -> '.join(seen)}")
    for name in block.marker.after if block.marker else []:
        run_block(_named(block, name), sandbox, (*seen, block.id))
    suffix = ".py" if block.language == "python" else ".sh"
    script = sandbox / f"snippet_{block.line}{suffix}"
    script.write_text(block.code_to_run(), encoding="utf-8")
    runner = [sys.executable] if block.language == "python" else RUNNERS[block.language]
    marker = block.marker or Marker()
    result = run_bounded([*runner, script.name], _environment(sandbox, block.marker),
                         marker.timeout_s, cwd=str(sandbox))
    output = result.stdout or ""
    assert result.returncode == marker.exit_status, (
        f"{block.id} exited {result.returncode}, expected {marker.exit_status}:\n"
        f"{block.code_to_run()}\n--- output (tail) ---\n{output[-6000:]}")
    for text in marker.expect:
        assert text in output, f"{block.id}: output lacks {text!r}:\n{output[-6000:]}"
    return output


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.runs_here], ids=lambda b: b.id)
def test_block_runs(block: Block, sandbox: pathlib.Path) -> None:
    if os.environ.get(INSIDE_A_SNIPPET):
        pytest.skip("inside a doc snippet: blocks never run nested")
    if any(c in block.code for c in NEVER_INSIDE_THE_SUITE):
        pytest.fail(f"{block.id} runs the main job or the test suite; mark it skip (reason)")
    run_block(block, sandbox)
