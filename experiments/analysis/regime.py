"""Whether each trial ran in the regime the comparison asked for: its solo runs' C, M and M/C.

Why: crossing pays according to M/C, and C depends on the machine, which can drift during a
run of an hour (issue 39: one run's solo step grew from 1.00 to 1.35 s over four trials while
M stayed put, so M/C fell from the asked-for 1 to 0.64, and the headline win became a tie with
nothing in the report saying why). Each trial's own solo runs give its M/C; a trial more than
TOLERANCE away from the asked-for M/C is marked, and the verdict says how many trials were in
the regime. The table shows the drift without opening compare.json.
"""
from __future__ import annotations

import dataclasses

from crossover_tf_planner.compare_record import Comparison
from experiments.comparison import trials as trials_lib

TOLERANCE = 0.15  # a trial's M/C within +-15% of the asked-for M/C is in the regime


@dataclasses.dataclass(frozen=True)
class TrialRegime:
    """One trial's solo runs: each job's step, compute C and allreduce M (seconds), the M/C
    they give, and whether that is within TOLERANCE of the asked-for M/C (None: nothing was
    asked for, a fixed link)."""
    trial: int
    step_s: dict[str, float]
    compute_s: dict[str, float]
    comm_s: dict[str, float]
    comm_to_compute: float
    in_regime: bool | None


def trial_regimes(result: Comparison) -> list[TrialRegime]:
    """Every trial's regime, in trial order (none for a trial without solo runs)."""
    asked = result.regime.comm_to_compute_asked if result.regime else None
    out = []
    for index, trial in enumerate(result.trials_or_self):
        solos = trial.solo_stats()
        if not solos:
            continue
        ratio = trials_lib.comm_to_compute(trial)
        out.append(TrialRegime(
            index, {j: s.step_time_s for j, s in solos.items()},
            {j: s.device_s for j, s in solos.items()}, {j: s.comm_s for j, s in solos.items()},
            ratio, None if asked is None else abs(ratio / asked - 1) <= TOLERANCE))
    return out


def in_regime_count(result: Comparison) -> tuple[int, int] | None:
    """(trials in the regime, trials with solo runs); None where no M/C was asked for."""
    return _count(trial_regimes(result))


def _count(regimes: list[TrialRegime]) -> tuple[int, int] | None:
    if not regimes or regimes[0].in_regime is None:
        return None
    return sum(r.in_regime for r in regimes), len(regimes)


def drift_lines(result: Comparison) -> list[str]:
    """One row per trial: each job's solo step, C and M (ms), the trial's M/C, and whether it
    is in the regime; then how many trials were."""
    regimes = trial_regimes(result)
    if len(regimes) < 2:
        return []
    jobs = list(regimes[0].step_s)
    asked = result.regime.comm_to_compute_asked if result.regime else None
    mark = f"within ±{TOLERANCE:.0%} of {asked:g}" if asked is not None else "no M/C asked"
    lines = ["", "Each trial's solo runs (drift shows here: C growing while M stays means the "
             "machine slowed, and M/C falls):", "",
             "| trial | " + " | ".join(f"{j} step / C / M (ms)" for j in jobs)
             + f" | M/C | {mark} |",
             "|---|" + "---:|" * (len(jobs) + 1) + ":---:|"]
    for r in regimes:
        cells = [f"{1e3 * r.step_s[j]:.0f} / {1e3 * r.compute_s[j]:.0f} / {1e3 * r.comm_s[j]:.0f}"
                 for j in jobs]
        verdict = "—" if r.in_regime is None else ("yes" if r.in_regime else "**no**")
        lines.append(f"| {r.trial} | " + " | ".join(cells)
                     + f" | {r.comm_to_compute:.2f} | {verdict} |")
    counted = _count(regimes)
    if counted is not None:
        inside, total = counted
        lines += ["", f"{inside} of {total} trials ran within ±{TOLERANCE:.0%} of the asked-for "
                  f"M/C {asked:g}" + ("." if inside == total else
                                      "; the calls below rest on every trial, out of the "
                                      "regime ones included.")]
    return lines
