"""Whether each trial ran in the regime the comparison asked for: its solo runs' C, M and M/C.

Why: crossing pays according to M/C, and C depends on the machine, which can drift during a
run of an hour (issue 39: one run's solo step grew from 1.00 to 1.35 s over four trials while
M stayed put, so M/C fell from the asked-for 1 to 0.64, and the headline win became a tie with
nothing in the report saying why). Each trial's own solo runs give its M/C; a trial more than
TOLERANCE away from the asked-for M/C is marked, and the verdict says how many trials were in
the regime. The comparison re-shapes the link before the next trial when one drifts
(comparison/run.py), and its calls rest on the trials in the regime (judge). The table shows
the drift without opening compare.json, and the drift probe (the same solo run before and
after the trials) says whether the machine itself slowed.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from crossover_tf_planner import registry
from crossover_tf_planner.compare_record import Comparison, Trial
from experiments.comparison import period_calibrate, period_fit
from experiments.comparison import trials as trials_lib

TOLERANCE = 0.15  # a trial's M/C within +-15% of the asked-for M/C is in the regime


def in_tolerance(ratio: float, asked: float) -> bool:
    """Whether an achieved M/C is within TOLERANCE of the asked-for one."""
    return abs(ratio / asked - 1) <= TOLERANCE


def judge(per_trial: Sequence[Trial], asked: float | None,
          period_asked: float | None = None) -> list[Trial]:
    """The trials with those out of the regime (M/C, and T_B/T_A where `period_asked`) kept
    for their tables but without ratios (so out of every median, interval, verdict and the
    representative trial), the reason under invalid: the calls then rest on the trials that
    ran in the asked-for regime. Unchanged where nothing was asked (a fixed link, twin jobs),
    or where every trial, or none, is in the regime (then the calls rest on all of them, and
    compare.md says at which M/C and T_B/T_A)."""
    if asked is None and period_asked is None:
        return list(per_trial)
    off = {i: _off_regime(t, asked, period_asked) for i, t in enumerate(per_trial)}
    inside = {i for i, reason in off.items() if reason is None}
    if not inside or len(inside) == len(per_trial):
        return list(per_trial)
    return [t if i in inside else dataclasses.replace(
        t, ratios={}, invalid={**t.invalid, registry.OUT_OF_REGIME: (
            f"{off[i]}: every ratio of this trial is left out of the calls")})
        for i, t in enumerate(per_trial)]


def _off_regime(trial: Trial, asked: float | None, period_asked: float | None) -> str | None:
    """Why a trial is out of the regime (None: in it)."""
    if not trial.solo_stats():
        return "no solo runs to say its M/C"
    ratio = trials_lib.comm_to_compute(trial)
    if asked is not None and not in_tolerance(ratio, asked):
        return (f"its solo runs' M/C {ratio:.2f} is more than {TOLERANCE:.0%} off the "
                f"asked-for {asked:g}")
    period = period_calibrate.period_ratio(trial.solo_stats())
    if period_asked is not None and not period_fit.in_tolerance(period, period_asked):
        return (f"its solo runs' T_B/T_A {period:.2f} is more than "
                f"{period_fit.TOLERANCE:.0%} off the asked-for {period_asked:g}")
    return None


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
    bandwidth_mbit: float | None = None  # the link this trial ran at (re-shaped after a drift)
    period_ratio: float | None = None  # T_B/T_A of its solo runs (two jobs)
    in_period_regime: bool | None = None  # within period_fit.TOLERANCE (None: none asked)


def trial_regimes(result: Comparison) -> list[TrialRegime]:
    """Every trial's regime, in trial order (none for a trial without solo runs)."""
    asked = result.regime.comm_to_compute_asked if result.regime else None
    period_asked = result.regime.period_ratio_asked if result.regime else None
    out = []
    for index, trial in enumerate(result.trials_or_self):
        solos = trial.solo_stats()
        if not solos:
            continue
        ratio = trials_lib.comm_to_compute(trial)
        period = period_calibrate.period_ratio(solos) if set(solos) == {"A", "B"} else None
        out.append(TrialRegime(
            index, {j: s.step_time_s for j, s in solos.items()},
            {j: s.device_s for j, s in solos.items()}, {j: s.comm_s for j, s in solos.items()},
            ratio, None if asked is None else in_tolerance(ratio, asked),
            trial.settings.get("bandwidth_mbit"), period,
            None if period_asked is None or period is None
            else period_fit.in_tolerance(period, period_asked)))
    return out


def in_regime_count(result: Comparison) -> tuple[int, int] | None:
    """(trials in the regime, trials with solo runs); None where no M/C was asked for."""
    return _count(trial_regimes(result))


def _count(regimes: list[TrialRegime]) -> tuple[int, int] | None:
    """(trials in the regime: M/C, and T_B/T_A where asked; trials) where M/C was asked."""
    if not regimes or regimes[0].in_regime is None:
        return None
    return (sum(bool(r.in_regime) and r.in_period_regime is not False for r in regimes),
            len(regimes))


def drift_lines(result: Comparison) -> list[str]:
    """One row per trial: each job's solo step, C and M (ms), the trial's M/C, and whether it
    is in the regime; then how many trials were."""
    regimes = trial_regimes(result)
    if len(regimes) < 2:
        return []
    jobs = list(regimes[0].step_s)
    asked = result.regime.comm_to_compute_asked if result.regime else None
    period_asked = result.regime.period_ratio_asked if result.regime else None
    mark = f"within ±{TOLERANCE:.0%} of {asked:g}" if asked is not None else "no M/C asked"
    period_head = (f" T_B/T_A | within ±{period_fit.TOLERANCE:.0%} of {period_asked:g} |"
                   if period_asked is not None else "")
    lines = ["", "Each trial's solo runs (drift shows here: C growing while M stays means the "
             "machine slowed, and M/C falls"
             + ("; M/C is job A's, job B being shaped to the asked-for T_B/T_A" if period_head
                else "") + "):", "",
             "| trial | Mbit/s | " + " | ".join(f"{j} step / C / M (ms)" for j in jobs)
             + f" | M/C | {mark} |" + period_head,
             "|---|---:|" + "---:|" * (len(jobs) + 1) + ":---:|"
             + ("---:|:---:|" if period_head else "")]
    for r in regimes:
        cells = [f"{1e3 * r.step_s[j]:.0f} / {1e3 * r.compute_s[j]:.0f} / {1e3 * r.comm_s[j]:.0f}"
                 for j in jobs]
        link = "—" if r.bandwidth_mbit is None else f"{r.bandwidth_mbit:.4g}"
        period = (f" {r.period_ratio:.2f} | {_mark(r.in_period_regime)} |"
                  if period_head and r.period_ratio is not None else "")
        lines.append(f"| {r.trial} | {link} | " + " | ".join(cells)
                     + f" | {r.comm_to_compute:.2f} | {_mark(r.in_regime)} |" + period)
    counted = _count(regimes)
    if counted is not None:
        period_also = (f" and of the asked-for T_B/T_A {period_asked:g} "
                       f"(±{period_fit.TOLERANCE:.0%})" if period_head else "")
        lines += ["", f"{counted[0]} of {counted[1]} trials ran within ±{TOLERANCE:.0%} of the "
                  f"asked-for M/C {asked:g}{period_also}{calls_basis(result)}"]
    return lines


def _mark(inside: bool | None) -> str:
    return "—" if inside is None else ("yes" if inside else "**no**")


def calls_basis(result: Comparison) -> str:
    """What the calls rest on: the trials in the regime alone where judge left the others out
    (their reasons under registry.OUT_OF_REGIME); every trial where all were in the regime, or none
    (or in a record written before judge, whose calls rest on every trial, drifted or not)."""
    counted = in_regime_count(result)
    if counted is None or counted[0] == counted[1]:
        return "."
    if registry.OUT_OF_REGIME in result.invalid:
        left_out = len(result.invalid[registry.OUT_OF_REGIME])
        return (f"; the calls rest on the trials in the regime alone (the other {left_out} are "
                "listed under 'Out of the regime').")
    return ("; the calls rest on every trial, out of the regime ones included, and hold at the "
            "achieved M/C above, not at the asked-for one.")


def drift_probe_lines(result: Comparison) -> list[str]:
    """The drift probe's start and end (the same solo run of job A before and after the
    trials) and the census beside each: a slower end with nothing piling up points at the
    machine, a pile-up at the project."""
    probe = (result.regime.drift_probe if result.regime else None) or {}
    start, end = probe.get("start"), probe.get("end")
    if not start or not end:
        return []
    change = end["step_s"] / start["step_s"] - 1
    held = ("held" if abs(change) <= TOLERANCE else
            f"**{'slowed' if change > 0 else 'sped up'} by {abs(change):.0%}**")
    lines = ["", f"Drift probe (job A alone, {start['steps']} steps at "
             f"{probe['bandwidth_mbit']:.4g} Mbit/s, before and after the trials): the machine "
             f"{held} (step {change:+.1%}).", "",
             "| probe | step (ms) | C (ms) | M (ms) | processes | namespaces | /dev/shm files "
             "| load (1 min) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, run in (("start", start), ("end", end)):
        lines.append(f"| {name} | {_ms(run, 'step_s')} | {_ms(run, 'compute_s')} | "
                     f"{_ms(run, 'comm_s')} | {_cell(run, 'processes')} | "
                     f"{_cell(run, 'namespaces')} | {_cell(run, 'shm_files')} | "
                     f"{_cell(run, 'load_1min', '.2f')} |")
    if start.get("steal_s") is not None and end.get("steal_s") is not None:
        lines += ["", f"CPU time stolen by the hypervisor between the probes: "
                  f"{end['steal_s'] - start['steal_s']:.1f} s."]
    return lines


def _ms(run: Mapping[str, Any], key: str) -> str:
    return f"{1e3 * run[key]:.0f}"


def _cell(run: Mapping[str, Any], key: str, spec: str = "") -> str:
    value = run.get(key)
    return "—" if value is None else format(value, spec)
