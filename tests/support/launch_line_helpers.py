"""Three jobs' profiles and a launch-line parser, shared by the planner's launch-line tests
(tests/unit/test_planner_launch_lines.py) and the Slurm run of such a line
(tests/system/test_deploy_slurm.py)."""
from __future__ import annotations

import shlex

import crossover_tf_planner as planner

PROFILES = [planner.JobProfile(name=n, compute_s=0.05, comm_s=c)
            for n, c in (("A", 0.05), ("B", 0.05), ("C", 0.0))]


def parse(line: str) -> tuple[dict[str, str], list[str]]:
    """The environment a launch line sets and the command after it."""
    words = shlex.split(line)
    env = {}
    while "=" in words[0] and not words[0].startswith("-"):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words
