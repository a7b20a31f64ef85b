"""The shift experiment's one table (issue 50, scripts/run_shift.sh): at each asked-for
T_B/T_A, each scenario over naive with its 95% interval and call, the planner's prediction
made before the trials (analysis/upfront.py, from the period calibration's solo runs), and
whether the two agreed; then the planner's up-front recommendation against the measured
winner. Rows come from compare.json results; pure formatting, no runs."""
from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence

from crossover_tf_planner import registry
from crossover_tf_planner.compare_record import Comparison
from experiments.analysis import intervals
from experiments.analysis import regime as regime_lib
from experiments.comparison import period_fit

AGREEMENT = {True: "agreed", False: "**disagreed**",
             None: "do not pair is judged against sequential, in each compare.md's verdict"}
MIN_GAIN = 0.05  # a predicted gain the planner counts (its recommendation's min_gain)
FAMILY = {registry.NAIVE: "naive", registry.SHIFT: "shift", registry.CROSSOVER: "cross",
          registry.CROSSOVER_TURN: "cross"}  # a measured winner as a recommendation


def _measured(result: Comparison, scenario: str) -> dict[str, Any] | None:
    key = registry.scenario_ratio(scenario, registry.NAIVE).key
    if key not in result.ratios:
        return None
    found = result.ratio_interval.get(key)
    low, high = (found.low, found.high) if found else (result.ratios[key],) * 2
    return {"median": result.ratios[key], "low": low, "high": high,
            "call": intervals.call(low, high)}


def row(result: Comparison) -> dict[str, Any]:
    """One asked-for T_B/T_A: its achieved ratios, each scenario over naive measured and
    predicted, and the up-front recommendation against the measured winner."""
    regime = result.regime
    before = (regime.period_calibration or {}).get("prediction", {})
    regimes = regime_lib.trial_regimes(result)
    scenarios = {}
    for scenario, predicted in before.get("over_naive", {}).items():
        measured = _measured(result, scenario)
        if measured is None:
            continue
        predicted_call = "win" if predicted >= 1 + MIN_GAIN else "no gain"
        scenarios[scenario] = {**measured, "predicted": predicted,
                               "predicted_call": predicted_call,
                               "agreed": (predicted_call == "win") == (measured["call"] == "win")}
    wins = {s: m["median"] for s, m in scenarios.items() if m["call"] == "win"}
    winner = FAMILY[max(wins, key=wins.get)] if wins else "naive"
    return {"period_ratio_asked": regime.period_ratio_asked,
            "achieved_period_ratio": statistics.median(
                r.period_ratio for r in regimes) if regimes else None,
            "achieved_comm_to_compute": statistics.median(
                r.comm_to_compute for r in regimes) if regimes else None,
            "trials": result.trials, "scenarios": scenarios,
            "recommended": before.get("recommendation"), "measured_winner": winner,
            "agreed": (None if before.get("recommendation") == "do not pair"
                       else before.get("recommendation") == winner)}


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The table, its calls' rule and one line per ratio: recommended before, measured."""
    lines = ["| T_B/T_A asked (achieved) | M/C of A | scenario / naive | measured [95%] | call "
             "| predicted before the trials | agreed |", "|---|---:|---|---:|---|---:|:---:|"]
    for r in rows:
        period = r["achieved_period_ratio"]
        off = period is not None and not period_fit.in_tolerance(period, r["period_ratio_asked"])
        achieved = "" if period is None else (f" (**{period:.2f}**)" if off else f" ({period:.2f})")
        mc = f"{r['achieved_comm_to_compute']:.2f}" if r["achieved_comm_to_compute"] else "—"
        for scenario, s in r["scenarios"].items():
            lines.append(
                f"| {r['period_ratio_asked']:g}{achieved} | {mc} | {scenario} / naive | "
                f"{s['median']:.3f} [{s['low']:.3f}–{s['high']:.3f}] | {s['call']} | "
                f"{s['predicted']:.3f} ({s['predicted_call']}) | "
                f"{'yes' if s['agreed'] else '**no**'} |")
    lines += ["", f"An achieved T_B/T_A in bold is more than {period_fit.TOLERANCE:.0%} off the "
              "asked-for one (the median over trials: see each compare.md's regime table). "
              f"A measured call is the 95% interval's ({intervals.WIN_BAR:.0%} bar, as "
              f"compare.md's); a predicted one a gain of {MIN_GAIN:.0%} (the planner's "
              "min_gain). Predictions come from solo runs made before the trials (the period "
              "calibration's), on the cpu device model with the comparison's probes.", ""]
    lines += [f"- T_B/T_A {r['period_ratio_asked']:g}: recommended before the trials "
              f"**{r['recommended'] or '—'}**; measured winner over naive "
              f"**{r['measured_winner']}** ({AGREEMENT[r['agreed']]})" for r in rows]
    return "\n".join(lines) + "\n"
