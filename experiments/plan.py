"""Planner front end: should these jobs be paired, how, and what does it give at scale?

Modes (``--mode``):

* ``recommend``: two ``--profiles`` -> predicted throughput per policy and a
  recommendation (cross, shift, do not pair);
* ``pair``: N ``--profiles`` -> which jobs to pair (maximum-weight matching);
* ``simulate``: ``--profiles`` (or ``--n_jobs`` synthetic ones) on ``--n_hosts``
  hosts -> simulated vs analytical cluster throughput per policy;
* ``sweep``: grid of C/M and period ratios -> where shift vs crossover helps
  (JSON, markdown table, PNG heat map);
* ``validate``: a ``--comparison`` JSON from experiments/compare.py -> predicted
  vs measured ratios with % errors (``--comm_cpu`` adds a calibrate.json's CPU cost).

The modes that measure on the emulated cluster (calibrate, link_sharing, contention) are
``python -m experiments.probes``; this script only plans, without TensorFlow or a cluster.
``--device_model`` says how jobs share a device without a scheduler (device_models.py):
``gpu`` (time-sliced contexts, random phases) for recommend and pair, ``cpu`` (one
time-sliced core: naive co-location keeps it busy) for comparisons on the emulated cluster.
Both charge the link contention a comparison measured (its regime's ``link_contention``).

Everything lands in ``--out_dir`` as ``<mode>.json`` and ``<mode>.md``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Mapping

from absl import app, flags

from crossover_tf_planner import (analytical, cli, cluster_sim, pairing, profile, sweep,
                                  validate)
from crossover_tf_planner.comm_cost import NO_CONTENTION, LinkContention, load_link_contention
from crossover_tf_planner.json_io import InputFileError
from crossover_tf_planner.device_models import DEVICE_MODELS
from experiments import config as config_lib

MODES = ("recommend", "pair", "simulate", "sweep", "validate")


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines this script's flags on flag_values; a flag another script already defined
    (seed, out_dir) is shared."""
    define = config_lib.flag_definer(flag_values)
    define(flags.DEFINE_enum, "mode", "sweep", "What to plan.", enum_values=list(MODES))
    define(flags.DEFINE_list, "profiles", [],
           "Jobs' profile JSON files or stats.json files (told apart by their fields).")
    define(flags.DEFINE_string, "comparison", None, "compare.py JSON (validate mode).")
    define(flags.DEFINE_string, "out_dir", "runs/plan", "Where results are written.")
    define(flags.DEFINE_float, "min_gain", 0.05, "Least gain over sequential worth pairing.")
    define(flags.DEFINE_float, "device_efficiency", 1.0,
           "Device throughput when two jobs share it without a lease (1 = perfect sharing).")
    define(flags.DEFINE_integer, "n_hosts", 64, "Hosts in the simulated cluster.")
    define(flags.DEFINE_integer, "n_jobs", 32, "Synthetic jobs when no --profiles.")
    define(flags.DEFINE_integer, "sim_steps", 100, "Steps each simulated job runs.")
    define(flags.DEFINE_integer, "seed", 0, "Seed of synthetic jobs and simulator draws.")
    define(flags.DEFINE_list, "cm_ratios", [f"{r:.4g}" for r in sweep.DEFAULT_CM_RATIOS],
           "Sweep: compute/comm ratios.")
    define(flags.DEFINE_list, "period_ratios", [f"{p:.4g}" for p in sweep.DEFAULT_PERIOD_RATIOS],
           "Sweep: period ratios T_B/T_A.")
    define(flags.DEFINE_float, "threshold", 0.05, "Sweep: gain over naive that counts as help.")
    define(flags.DEFINE_float, "handoff_s", 2e-4, "Sweep: lease hand-off cost (s).")
    define(flags.DEFINE_enum, "device_model", "gpu", "How jobs share a device without a "
           "scheduler (recommend, pair; validate always models the emulated cluster's cpu).",
           enum_values=sorted(DEVICE_MODELS))
    define(flags.DEFINE_string, "comm_cpu", None,
           "validate: a calibrate.json (python -m experiments.probes --mode=calibrate) whose "
           "allreduce CPU cost the cpu model charges.")
    define(flags.DEFINE_string, "link_contention", None,
           "recommend, pair, validate: a contention.json (probes --mode=contention on the cluster "
           "the jobs share) whose link contention the models charge; validate: instead of "
           "the comparison's own. Default: recommend and pair assume a lossless link.")



FLAG_NAMES = config_lib.defined_names(define_flags)


def _check_settings(c: Any) -> None:
    config_lib.require(c.mode in MODES, f"mode must be one of {MODES}, got {c.mode!r}")


def _settings(flag_values: Any, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    return vars(config_lib.resolve(flag_values, FLAG_NAMES, overrides, _check_settings,
                                   "plan"))


def _profiles(settings: Mapping[str, Any], at_least: int) -> list[profile.JobProfile]:
    paths = list(settings["profiles"])
    if len(paths) < at_least:
        raise ValueError(f"mode {settings['mode']!r} needs at least {at_least} --profiles, "
                         f"got {len(paths)}")
    return profile.load_profiles(paths)


def _contention(s: Mapping[str, Any]) -> LinkContention | None:
    """--link_contention's record, or None when not given."""
    return load_link_contention(s["link_contention"]) if s["link_contention"] else None


def _recommend(s: Mapping[str, Any]) -> tuple[dict, str]:
    profiles = _profiles(s, 2)
    if len(profiles) != 2:
        raise ValueError("recommend takes exactly two --profiles (use --mode=pair for more)")
    prediction = analytical.predict_pair(*profiles, min_gain=s["min_gain"],
                                         device_efficiency=s["device_efficiency"],
                                         model=s["device_model"],
                                         contention=_contention(s) or NO_CONTENTION)
    return prediction.to_dict(), prediction.to_markdown()


def _pair(s: Mapping[str, Any]) -> tuple[dict, str]:
    plan = pairing.plan_pairs(_profiles(s, 1), min_gain=s["min_gain"],
                              device_efficiency=s["device_efficiency"],
                              model=s["device_model"],
                              contention=_contention(s) or NO_CONTENTION)
    return plan.to_dict(), plan.to_markdown()


def _simulate(s: Mapping[str, Any]) -> tuple[dict, str]:
    jobs = (profile.load_profiles(s["profiles"]) if s["profiles"]
            else cluster_sim.synthetic_profiles(s["n_jobs"], seed=s["seed"]))
    report = cluster_sim.run_cluster(jobs, s["n_hosts"], steps=s["sim_steps"], seed=s["seed"])
    return report, cluster_sim.to_markdown(report)


def _sweep(s: Mapping[str, Any]) -> tuple[dict, str]:
    result = sweep.run_sweep([float(r) for r in s["cm_ratios"]],
                             [float(p) for p in s["period_ratios"]],
                             handoff_s=s["handoff_s"], threshold=s["threshold"])
    png = sweep.save_heatmap(result, os.path.join(s["out_dir"], "sweep.png"))
    return {**result.to_dict(), "heatmap": png}, result.to_markdown()


def _validate(s: Mapping[str, Any]) -> tuple[dict, str]:
    if not s["comparison"]:
        raise ValueError("validate mode needs --comparison=<compare.py JSON>")
    comm_cpu = None
    if s["comm_cpu"]:
        with open(s["comm_cpu"], encoding="utf-8") as handle:
            comm_cpu = json.load(handle)
    report = validate.validate_comparison(s["comparison"], seed=s["seed"], comm_cpu=comm_cpu,
                                          contention=_contention(s))
    return report, validate.to_markdown(report)


_HANDLERS = {"recommend": _recommend, "pair": _pair, "simulate": _simulate,
             "sweep": _sweep, "validate": _validate}


def run(flag_values: Any = None, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Runs one mode; ``overrides`` replace flag values (for tests and callers)."""
    s = _settings(flag_values if flag_values is not None else flags.FLAGS, overrides)
    return config_lib.run_mode(s, _HANDLERS)


def main(argv: list[str]) -> None:
    """Prints the mode's markdown; a bad --profiles or --link_contention file ends with one
    line naming it and exit status 2 (as crossover-plan does), not a traceback."""
    del argv
    try:
        print(run(flags.FLAGS)["markdown"])
    except InputFileError as error:
        print(f"plan: error: {error}", file=sys.stderr)
        sys.exit(cli.EXIT_BAD_INPUT)


if __name__ == "__main__":
    define_flags()
    app.run(main)
