"""From the planner's pairs to Slurm launches an operator can submit as they are.

Why the steps recipe (deploy/slurm/crossover_steps.sbatch): two jobs cross only on one device
of one node, and two separate sbatch jobs land together only with a node list the planner
cannot know; one allocation with two `srun --overlap` steps is on one node by construction,
and its steps share the job's /dev/shm. Each pair gets its own group, the group's job count
and, for crossing with link turns, the two link turn positions, appended to each job's command
as experiments/train.py's flags, which the installed example job
(crossover_tf.examples.fit_synthetic) takes too (a user's script that takes them launches the
same way). A naive or shifted pair runs the same recipe without a group: co-located, no lease.
"""
from __future__ import annotations

import dataclasses
import re
import shlex
from typing import Mapping

from crossover_tf_planner.pairing import PairingPlan

STEPS_RECIPE = "deploy/slurm/crossover_steps.sbatch"
DEFAULT_JOIN_TIMEOUT_S = 600.0  # both steps start together; a slow node still joins in time
_GROUP_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


@dataclasses.dataclass(frozen=True)
class PairLaunch:
    """One recommended pair's launch: its group ("" for naive co-location), each job's full
    command, and the line that submits both."""
    job_a: str
    job_b: str
    recommendation: str
    group: str
    commands: tuple[str, str]
    line: str


def default_command(job: str) -> str:
    """The command of a job the caller gave none for: the example job installed with
    crossover_tf, under its name (experiments/ exists only in a checkout, not on the nodes)."""
    return f"python -m crossover_tf.examples.fit_synthetic --job={shlex.quote(job)}"


def pair_group(index: int, job_a: str, job_b: str) -> str:
    """A group name unique per pair of one plan, within the lease's 64-character rule."""
    names = _GROUP_UNSAFE.sub("-", f"{job_a}-{job_b}")[:48].strip("-") or "pair"
    return f"xo{index}-{names}"


def slurm_launches(plan: PairingPlan, commands: Mapping[str, str] | None = None, *,
                   join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S,
                   sbatch_options: str = "", recipe: str = STEPS_RECIPE) -> list[PairLaunch]:
    """The launch of every pair in ``plan``: ``commands`` maps a job's name to its command
    (default: default_command); ``sbatch_options`` go before the recipe (e.g.
    "--gres=gpu:1 --partition=gpu")."""
    commands = dict(commands or {})
    launches = []
    for index, pair in enumerate(plan.pairs):
        crossing = pair.recommendation == "cross"
        group = pair_group(index, pair.job_a, pair.job_b) if crossing else ""
        full = []
        for position, job in enumerate((pair.job_a, pair.job_b)):
            flags = []
            if crossing:
                flags += [f"--group={group}", "--group_jobs=2",
                          f"--join_timeout_s={join_timeout_s:g}"]
                if pair.policy == "crossover_turn":
                    flags.append(f"--link_turn={position}")
            full.append(" ".join([commands.get(job, default_command(job)), *flags]))
        env = " ".join(f"CROSSOVER_COMMAND_{side}={shlex.quote(command)}"
                       for side, command in zip("AB", full))
        line = " ".join(part for part in (env, "sbatch", sbatch_options, recipe) if part)
        launches.append(PairLaunch(pair.job_a, pair.job_b, pair.recommendation, group,
                                   (full[0], full[1]), line))
    return launches


def slurm_script(plan: PairingPlan, launches: list[PairLaunch]) -> str:
    """A shell script of the launches, each with a comment saying what the planner chose and
    why; the jobs left unpaired run alone, as the scheduler runs any job."""
    lines = ["#!/bin/bash",
             f"# Launches of crossover-plan pair ({STEPS_RECIPE}: one allocation,",
             "# two srun --overlap steps on one node and its device).", "set -e"]
    for launch, pair in zip(launches, plan.pairs):
        lines.append(f"# {launch.job_a} + {launch.job_b}: {pair.recommendation} "
                     f"({pair.policy}), predicted {pair.expected_gain - 1:+.1%} vs sequential")
        lines.append(launch.line)
    if plan.unpaired:
        lines.append(f"# Unpaired (run alone): {', '.join(plan.unpaired)}")
    return "\n".join(lines) + "\n"
