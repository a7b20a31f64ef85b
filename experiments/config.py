"""Turns absl flags plus programmatic overrides into one validated, plain config object.

Every experiment script exposes `run(flags, overrides)`: tests and compare.py call it without a
command line, so values must be validated here too, not only by absl's flag validators.
"""
from __future__ import annotations

import json
import os
import types
from typing import Any, Callable, Mapping

from absl import app
from absl import flags as absl_flags

Validator = Callable[[types.SimpleNamespace], None]


def ensure_parsed(flag_values: absl_flags.FlagValues, program: str) -> None:
    """Parses an empty command line if nobody did (library use, tests), so defaults apply."""
    if not flag_values.is_parsed():
        flag_values([program])


def resolve(flag_values: absl_flags.FlagValues, names: list[str],
            overrides: Mapping[str, Any] | None, validate: Validator,
            program: str) -> types.SimpleNamespace:
    """Values of the named flags with overrides applied, then validated.

    Unknown override keys are an error: a typo must not silently run the default experiment.
    """
    ensure_parsed(flag_values, program)
    config = {name: flag_values[name].value for name in names}
    unknown = sorted(set(overrides or {}) - set(names))
    if unknown:
        raise ValueError(f"{program}: unknown setting(s) {unknown}; known: {sorted(names)}")
    config.update(overrides or {})
    namespace = types.SimpleNamespace(**config)
    validate(namespace)
    return namespace


def flag_definer(flag_values: absl_flags.FlagValues) -> Callable[..., None]:
    """How every experiment script defines its flags: `define(flags.DEFINE_x, name, default,
    help, **extra)` on flag_values, skipping a name another script already defined, so scripts
    that share flags (seed, out_dir, ...) can be loaded together and define_flags can repeat.
    A name shared with a different type is an error: a boolean `--x` that is really another
    script's string flag would swallow the next argument as its value."""

    def define(kind: Callable[..., Any], name: str, default: Any, help_text: str,
               **extra: Any) -> None:
        if name not in flag_values:
            kind(name=name, default=default, help=help_text, flag_values=flag_values, **extra)
            return
        scratch = absl_flags.FlagValues()
        kind(name=name, default=default, help=help_text, flag_values=scratch, **extra)
        if scratch[name].flag_type() != flag_values[name].flag_type():
            raise ValueError(f"flag --{name} is defined as {flag_values[name].flag_type()} and "
                             f"again as {scratch[name].flag_type()}: give one of them another "
                             "name")

    return define


def defined_names(define_flags: Callable[[absl_flags.FlagValues], None]) -> list[str]:
    """The names `define_flags` defines, in its order: a script's FLAG_NAMES, derived so that
    a flag added to define_flags cannot be left out of the settings it resolves."""
    scratch = absl_flags.FlagValues()
    define_flags(scratch)
    return list(scratch)


def adopt(flag_values: absl_flags.FlagValues,
          define_flags: Callable[[absl_flags.FlagValues], None],
          defaults: Mapping[str, Any]) -> None:
    """Defines another script's flags on flag_values (shared by name) and sets this script's
    defaults for the adopted ones (`defaults`, None: the other script's own)."""
    define_flags(flag_values)
    for name, default in defaults.items():
        if default is not None:
            flag_values.set_default(name, default)


def require(condition: bool, message: str) -> None:
    """Raises ValueError(message) unless condition holds: flag errors read as sentences."""
    if not condition:
        raise ValueError(message)


def script_main(run: Callable[[], Any]) -> Callable[[list[str]], None]:
    """The absl `main` of an experiment script: stray positional arguments are an error
    (a mistyped `--flag value` must not be ignored), then run() with the parsed flags."""

    def main(argv: list[str]) -> None:
        if len(argv) > 1:
            raise app.UsageError(f"unexpected positional arguments: {argv[1:]}")
        run()

    return main


def write_results(out_dir: str | os.PathLike, stem: str, data: Any, table: str) -> None:
    """Saves a script's result as <out_dir>/<stem>.json and its table as <stem>.md, and
    prints the table (what every experiment script leaves behind)."""
    out = os.fspath(out_dir)
    with open(os.path.join(out, f"{stem}.json"), "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, default=str)
    with open(os.path.join(out, f"{stem}.md"), "w", encoding="utf-8") as handle:
        handle.write(table)
    print(table)


def run_mode(settings: Mapping[str, Any],
             handlers: Mapping[str, Callable[[Mapping[str, Any]], tuple[Any, str]]]
             ) -> dict[str, Any]:
    """Runs settings["mode"]'s handler (-> result, markdown) and writes <out_dir>/<mode>.json
    and .md: what plan.py's and the probes' modes leave behind."""
    os.makedirs(settings["out_dir"], exist_ok=True)
    mode = settings["mode"]
    result, text = handlers[mode](settings)
    paths = {ext: os.path.join(settings["out_dir"], f"{mode}.{ext}") for ext in ("json", "md")}
    with open(paths["json"], "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
    with open(paths["md"], "w", encoding="utf-8") as handle:
        handle.write(text + "\n")
    return {"mode": mode, "result": result, "markdown": text, "paths": paths}
