"""`crossover-plan`: the planner's command line for people and schedulers.

    crossover-plan recommend a.json b.json [--json out.json]
    crossover-plan pair a.json b.json c.json ... [--json out.json] [--slurm launch.sh]

Each file is what a job wrote: a profile (crossover_tf.ProfileCallback) or a stats.json
(experiments/train.py). It prints the recommendation (markdown) and, with ``--json PATH``,
writes the result's JSON there for a scheduler; pair's ``--slurm PATH`` writes each pair's
Slurm launch, filled in (launch_lines). ``-`` for either puts it on stdout alone (the report
then goes to stderr), so a redirected script or JSON stays whole; both on stdout is refused. A
bad file ends with one line naming it and exit status 2. It lives in the planner, not in
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
                             help="also write the result's JSON here ('-': stdout, the report "
                                  "then on stderr)")
        if name == "pair":
            command.add_argument("--slurm", metavar="PATH",
                                 help="write each pair's Slurm launch (deploy/slurm/"
                                      "crossover_steps.sbatch) to this script ('-': "
                                      "stdout, the report then on stderr; not with --json -)")
            command.add_argument("--command", action="append", default=[],
                                 dest="job_commands", metavar="JOB=COMMAND",
                                 help="a job's command for --slurm (default: the installed "
                                      "example, crossover_tf.examples.fit_synthetic, under "
                                      "the job's name); repeat per job")
            command.add_argument("--sbatch-options", "--sbatch_options", default="",
                                 help="sbatch options for --slurm, e.g. '--gres=gpu:1'")
        # Each option also takes the underscore spelling that experiments/plan.py's absl
        # flags use (--device_model), so a command copied between the two runs either way.
        command.add_argument("--min-gain", "--min_gain", type=float, default=0.05,
                             help="least gain a more involved policy must show (0.05)")
        command.add_argument("--device-model", "--device_model", choices=sorted(DEVICE_MODELS),
                             default="gpu",
                             help="how jobs share a device without a scheduler (gpu)")
        command.add_argument("--link-contention", "--link_contention", metavar="PATH",
                             help="contention.json measured on the jobs' cluster "
                                  "(default: a lossless link)")
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """Runs one command; returns the exit status (0, or EXIT_BAD_INPUT for a bad file)."""
    args = _parser().parse_args(argv)
    slurm = getattr(args, "slurm", None)
    if args.json == "-" and slurm == "-":
        return _bad_input("--json - and --slurm - both want stdout: write one to a file")
    commands = _job_commands(args.job_commands) if slurm else {}
    if commands is None:
        return EXIT_BAD_INPUT
    options = {"min_gain": args.min_gain, "device_model": args.device_model}
    try:
        profiles = load_profiles(args.jobs)
        if args.link_contention:
            options["contention"] = load_link_contention(args.link_contention)
        result = (api.recommend(*profiles, **options) if args.command == "recommend"
                  else api.pair(profiles, **options))
    except (InputFileError, StepRatioOutOfRange) as error:
        return _bad_input(str(error))
    # stdout carries one thing whole: the JSON, the script, or else the report.
    print(result.to_markdown(), file=sys.stderr if "-" in (args.json, slurm) else sys.stdout)
    if args.json:
        _write(result.to_json() + "\n", args.json)
    if slurm:
        _write(launch_lines.slurm_script(result, launch_lines.slurm_launches(
            result, commands, sbatch_options=args.sbatch_options)), slurm)
    return 0


def _write(text: str, path: str) -> None:
    """Writes text to path, or to stdout for '-'."""
    if path == "-":
        sys.stdout.write(text)
        return
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _bad_input(message: str) -> int:
    print(f"crossover-plan: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _job_commands(items: Sequence[str]) -> dict[str, str] | None:
    """--command's JOB=COMMAND pairs, checked before anything is written; None if one is bad."""
    commands = {}
    for item in items:
        job, sep, command = item.partition("=")
        if not sep or not job or not command:
            _bad_input(f"--command takes JOB=COMMAND, got {item!r}")
            return None
        commands[job] = command
    return commands


def main() -> None:
    """The console script's entry point (pyproject.toml: crossover-plan)."""
    sys.exit(run())
