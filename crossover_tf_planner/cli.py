"""`crossover-plan`: the planner's command line for people and schedulers.

    crossover-plan recommend a.json b.json [--json out.json]
    crossover-plan pair a.json b.json c.json ... [--json out.json] [--slurm launch.sh]

Each file is what a job wrote: a profile (crossover_tf.ProfileCallback) or a stats.json
(experiments/train.py). It prints the recommendation (markdown) and, with ``--json PATH``,
writes the result's JSON there for a scheduler (``--json -``: JSON on stdout instead); pair's
``--slurm PATH`` writes each pair's Slurm launch, filled in (launch_lines). A bad
file ends with one line naming it and exit status 2. It lives in the planner, not in
experiments/, because only crossover_tf* packages are installed, and imports no TensorFlow.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from crossover_tf_planner import api, launch_lines
from crossover_tf_planner.comm_cost import load_link_contention
from crossover_tf_planner.device_models import DEVICE_MODELS
from crossover_tf_planner.fluid import StepRatioOutOfRange
from crossover_tf_planner.json_io import InputFileError
from crossover_tf_planner.pairing import PairingPlan
from crossover_tf_planner.profile import load_profiles

EXIT_BAD_INPUT = 2  # argparse's status for bad usage, so both kinds of mistake read the same


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="crossover-plan", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, nargs, what in (("recommend", 2, "two jobs: cross, shift, naive or do not pair"),
                              ("pair", "+", "N jobs: which to pair")):
        command = commands.add_parser(name, help=what)
        command.add_argument("jobs", nargs=nargs, metavar="JOB.json",
                             help="a job's profile or stats.json")
        command.add_argument("--json", metavar="PATH",
                             help="also write the result's JSON here ('-': stdout only)")
        if name == "pair":
            command.add_argument("--slurm", metavar="PATH",
                                 help="write each pair's Slurm launch (deploy/slurm/"
                                      "crossover_steps.sbatch) to this script ('-': stdout)")
            command.add_argument("--command", action="append", default=[],
                                 metavar="JOB=COMMAND",
                                 help="a job's command for --slurm (default: experiments.train "
                                      "under the job's name); repeat per job")
            command.add_argument("--sbatch-options", default="",
                                 help="sbatch options for --slurm, e.g. '--gres=gpu:1'")
        command.add_argument("--min-gain", type=float, default=0.05,
                             help="least gain a more involved policy must show (0.05)")
        command.add_argument("--device-model", choices=sorted(DEVICE_MODELS), default="gpu",
                             help="how jobs share a device without a scheduler (gpu)")
        command.add_argument("--link-contention", metavar="PATH",
                             help="contention.json measured on the jobs' cluster "
                                  "(default: a lossless link)")
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """Runs one command; returns the exit status (0, or EXIT_BAD_INPUT for a bad file)."""
    args = _parser().parse_args(argv)
    options = {"min_gain": args.min_gain, "device_model": args.device_model}
    try:
        profiles = load_profiles(args.jobs)
        if args.link_contention:
            options["contention"] = load_link_contention(args.link_contention)
    except InputFileError as error:
        print(f"crossover-plan: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        result = (api.recommend(*profiles, **options) if args.command == "recommend"
                  else api.pair(profiles, **options))
    except StepRatioOutOfRange as error:
        print(f"crossover-plan: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json == "-":
        print(result.to_json())
        return 0
    print(result.to_markdown())
    if args.json:
        result.to_json(args.json)
    if getattr(args, "slurm", None):
        return _write_slurm(result, args)
    return 0


def _write_slurm(plan: PairingPlan, args: argparse.Namespace) -> int:
    """Writes the pairs' Slurm launches (launch_lines) where --slurm says."""
    commands = {}
    for item in args.command:
        job, sep, command = item.partition("=")
        if not sep or not job or not command:
            print(f"crossover-plan: error: --command takes JOB=COMMAND, got {item!r}",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
        commands[job] = command
    script = launch_lines.slurm_script(plan, launch_lines.slurm_launches(
        plan, commands, sbatch_options=args.sbatch_options))
    if args.slurm == "-":
        print(script, end="")
    else:
        with open(args.slurm, "w", encoding="utf-8") as handle:
            handle.write(script)
    return 0


def main() -> None:
    """The console script's entry point (pyproject.toml: crossover-plan)."""
    sys.exit(run())
