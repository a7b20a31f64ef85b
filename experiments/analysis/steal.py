"""What the hypervisor took from each scenario run, per trial, so a reader can tell another
tenant's noise from the jobs' own contention.

Why: on a shared cloud machine the hypervisor can take the cores for seconds at a time; a
crossed or naive run that lost them reads as contention between the jobs. Issue 52's Horovod
main job lost 6 s between its drift probes, and one of its trials' crossed rounds ran 286 ms
longer than solo against 85 ms shorter in another; with one total for the whole comparison
nobody could say which trials paid it. Each scenario run records its steal
(comparison/calibrate.steal_record); the table marks every run that lost more than FLAG_SHARE
of the machine's CPU time.
"""
from __future__ import annotations

from typing import Any, Mapping

from crossover_tf_planner.compare_record import Comparison, Trial

FLAG_SHARE = 0.01  # a CPU-bound run (all of them, on the emulation) losing 1% runs ~1% slower


def share(record: Mapping[str, Any]) -> float:
    """The share of the machine's CPU time the hypervisor took during one scenario run."""
    return record["stolen_s"] / (record["wall_s"] * record["cpus"])


def steal_lines(result: Comparison) -> list[str]:
    """One row per trial: each scenario's stolen CPU seconds and their share of the machine
    while it ran, marked where over FLAG_SHARE; then how many runs were. Nothing for records
    written before scenarios kept their steal."""
    trials = result.per_trial or [Trial({}, settings=result.settings)]  # a one-trial report
    records = [trial.settings.get("steal") or {} for trial in trials]
    names = list(dict.fromkeys(name for r in records for name, run in r.items() if run))
    if not names:
        return []
    flagged, counted = 0, 0
    lines = ["", "CPU time the hypervisor took during each scenario run, start-up included "
             "(seconds, and share of the machine's CPU time while it ran; **bold** above "
             f"{FLAG_SHARE:.0%}, where another tenant's load may have moved that run's ratios):",
             "",
             "| trial | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for trial, record in zip(trials, records):
        cells = []
        for name in names:
            run = record.get(name)
            if not run:
                cells.append("—")
                continue
            counted += 1
            cell = f"{run['stolen_s']:.1f} ({share(run):.1%})"
            if share(run) > FLAG_SHARE:
                flagged += 1
                cell = f"**{cell}**"
            cells.append(cell)
        lines.append(f"| {trial.settings.get('trial', '—')} | " + " | ".join(cells) + " |")
    lines += ["", f"{flagged} of {counted} scenario runs lost more than {FLAG_SHARE:.0%} to the "
              "hypervisor."]
    return lines
