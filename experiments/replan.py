"""Predicts again for saved comparisons, without running a job: the planner's columns of each
compare.json (and a sweep's sweep.{json,md,png}) from the solo profiles they hold, with the
current planner and, optionally, a comm CPU calibration (probes --mode=calibrate).

  python -m experiments.replan --dir=runs/sweep --comm_cpu=runs/plan/calibrate.json

Measurements are kept as they are; only predictions, recommendations and the tables built from
them are rewritten. The model is then checked on data it was not fitted to.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Mapping

from absl import app, flags

from crossover_tf_planner import registry
from crossover_tf_planner.compare_record import Comparison, Regime
from experiments import config as config_lib
from experiments.analysis import planning, report, sweep


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    define = config_lib.flag_definer(flag_values)
    define(flags.DEFINE_string, "dir", "runs/compare",
           "A compare.py --out_dir: one comparison, or a sweep's ratio_* comparisons.")
    define(flags.DEFINE_string, "comm_cpu", None,
           "calibrate.json from probes --mode=calibrate; replaces each comparison's own.")


FLAG_NAMES = config_lib.defined_names(define_flags)


def replan(directory: str | pathlib.Path,
           comm_cpu: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Rewrites the predictions of every comparison under `directory`; returns their sweep
    rows (ordered by asked M/C) after rewriting sweep.{json,md,png} when it is a sweep."""
    directory = pathlib.Path(directory)
    paths = sorted(directory.glob("ratio_*/compare.json")) or [directory / "compare.json"]
    if not paths[0].exists():
        raise ValueError(f"no compare.json in {directory} or its ratio_* directories")
    results = []
    for path in paths:
        result = Comparison.from_json(path)
        if comm_cpu is not None:
            regime = dataclasses.replace(result.regime or Regime(), comm_cpu=dict(comm_cpu))
            result = dataclasses.replace(result, regime=regime)
        result = planning.plan_trials(result)
        result.to_json(path)
        (path.parent / "compare.md").write_text(report.markdown(result))
        results.append(result)
    results.sort(key=lambda r: (r.regime.comm_to_compute_asked if r.regime else None) or 0.0)
    saved = directory / "sweep.json"
    if not saved.exists():
        return [sweep.row(r) for r in results
                if registry.NAIVE_OVER_SEQUENTIAL.key in r.ratios]
    rows = [sweep.row(r) for r in results]
    summary = {**json.loads(saved.read_text()), "rows": rows}
    saved.write_text(json.dumps(summary, indent=2))
    (directory / "sweep.md").write_text(sweep.markdown(rows))
    sweep.plot(rows, str(directory / "sweep.png"))
    return rows


def run(flag_values: flags.FlagValues = flags.FLAGS,
        overrides: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    define_flags(flag_values)
    c = config_lib.resolve(flag_values, FLAG_NAMES, overrides, lambda c: None, "replan")
    comm_cpu = json.loads(pathlib.Path(c.comm_cpu).read_text()) if c.comm_cpu else None
    rows = replan(c.dir, comm_cpu)
    if rows:
        print(sweep.markdown(rows))
    return rows


main = config_lib.script_main(run)


if __name__ == "__main__":
    define_flags()
    app.run(main)
