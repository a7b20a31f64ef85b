"""compare.md's table of the shift scenario's start shifts, one row per trial: what the rule
(crossover_tf_planner/shift_rule.py) picked and the allreduce overlap it predicted, beside the
overlap a random shift (naive co-location) gets, so a measured shift / naive reads against
what the rule expected to save."""
from __future__ import annotations

from crossover_tf_planner.compare_record import Comparison


def shift_lines(result: Comparison) -> list[str]:
    """The table (empty where the shift scenario did not run)."""
    rows = [(i, t.settings["shift"]) for i, t in enumerate(result.trials_or_self)
            if t.settings.get("shift")]
    if not rows:
        return []
    lines = ["", "Shift scenario (CASSINI's rule: periods aligned on their LCM, job B started "
             "where the allreduces overlap least; static, set once after the barrier):", "",
             "| trial | start shifts (ms) | hyperperiod (ms; steps of A / B) | predicted "
             "allreduce overlap (ms per hyperperiod) | at a random shift |",
             "|---|---|---:|---:|---:|"]
    for trial, plan in rows:
        shifts = ", ".join(f"{job} {1e3 * s:.0f}" for job, s in plan["start_shifts_s"].items())
        lines.append(f"| {trial} | {shifts} | {1e3 * plan['hyperperiod_s']:.0f} "
                     f"({plan['steps_a']} / {plan['steps_b']}) | {1e3 * plan['overlap_s']:.0f} | "
                     f"{1e3 * plan['random_overlap_s']:.0f} |")
    return lines
