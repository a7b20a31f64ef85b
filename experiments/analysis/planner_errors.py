"""The planner's error on every trial, with its spread, and what the measured intervals say of
its predictions: what compare.md claims of the planner.

One trial's error (the planner's own table) or a rounded "within 10% at every point" hides how
far the error moves between trials: at M/C 2 one point was +14.6% and +11.6% off in two of
three trials. So each ratio's error is given per trial as median [min–max] of predicted /
measured - 1, and a prediction counts as borne out only where it lies inside the measured
ratio's 95% interval; nothing wider is claimed.
"""
from __future__ import annotations

from typing import Any, Mapping

from crossover_tf_planner import registry
from crossover_tf_planner.compare_record import Comparison, Interval, Spread
from experiments.comparison import trials

METRIC = "aggregate_images_ratios"  # the planner's rows that the measured ratios divide alike
MODELS = ("analytical", "simulated")


def errors(result: Comparison, model: str) -> dict[str, Spread]:
    """Per validated ratio (the planner's key, crossover/naive), `model`'s predicted /
    measured - 1 over the trials whose planner predicted it."""
    found: dict[str, list[float]] = {}
    for trial in result.trials_or_self:
        for key, row in ((trial.planner or {}).get(METRIC) or {}).items():
            if model in row and row["measured"]:
                found.setdefault(key, []).append(row[model] / row["measured"] - 1)
    return {key: trials.spread(values) for key, values in found.items()}


def predictions(result: Comparison, model: str) -> dict[str, float]:
    """`model`'s prediction of each validated ratio, median over trials."""
    found: dict[str, list[float]] = {}
    for trial in result.trials_or_self:
        for key, row in ((trial.planner or {}).get(METRIC) or {}).items():
            if model in row:
                found.setdefault(key, []).append(row[model])
    return {key: trials.spread(values).median for key, values in found.items()}


def borne_out(prediction: float, interval: Interval | None) -> str:
    """Whether the measured interval holds the prediction ("—" without an interval)."""
    if interval is None:
        return "—"
    return "inside" if interval.low <= prediction <= interval.high else "outside"


def _percent(spread: Spread) -> str:
    if spread.min == spread.max:
        return f"{spread.median:+.1%}"
    return f"{spread.median:+.1%} [{spread.min:+.1%} to {spread.max:+.1%}]"


def markdown(result: Comparison, device_model: str) -> list[str]:
    """Lines of compare.md's planner block: each ratio's error per trial for each model, the
    median prediction inside or outside the measured 95% interval, and the count of those
    inside (nothing wider is claimed). Empty without a planner."""
    by_model = {model: errors(result, model) for model in MODELS}
    keys = [r for r in registry.VALIDATED_RATIOS if r.planner_key in by_model["analytical"]]
    if not keys:
        return []
    predicted = {model: predictions(result, model) for model in MODELS}
    n = len(result.trials_or_self)
    lines = ["", f"The planner's error on each of {n} trial(s), predicted / measured - 1 as "
             "median [min to max]; beside it, whether the median prediction lies inside the "
             "measured ratio's 95% interval:", "",
             f"| ratio | analytical, {device_model} model | simulated, gpu-like | "
             "measured 95% interval |", "|---|---|---|---|"]
    inside: dict[str, list[str]] = {model: [] for model in MODELS}
    for ratio in keys:
        interval = result.ratio_interval.get(ratio.key)
        cells = []
        for model in MODELS:
            spread = by_model[model].get(ratio.planner_key)
            if spread is None:
                cells.append("—")
                continue
            where = borne_out(predicted[model][ratio.planner_key], interval)
            inside[model].append(where)
            cells.append(f"{_percent(spread)}; {predicted[model][ratio.planner_key]:.3f} "
                         f"{where}")
        span = f"{interval.low:.3f}–{interval.high:.3f}" if interval else "—"
        lines.append(f"| {ratio.planner_key} | {' | '.join(cells)} | {span} |")
    lines += ["", _claim(inside, device_model)]
    return lines


def _claim(inside: Mapping[str, list[Any]], device_model: str) -> str:
    """What the intervals support, per model: how many predictions they hold."""
    names = {"analytical": f"the {device_model} model", "simulated": "the gpu-like simulator"}
    parts = [f"{names[m]} {calls.count('inside')} of "
             f"{len([c for c in calls if c != '—'])}" for m, calls in inside.items()
             if any(c != "—" for c in calls)]
    if not parts:
        return "No measured interval to check the predictions against."
    return ("Predictions inside the measured 95% interval: " + "; ".join(parts)
            + ". Only those are borne out by this comparison.")


def winner_checks(result: Comparison) -> list[str]:
    """compare.md's check of the planner's pick in every trial: the pick from that trial's own
    solo runs against that trial's measured winner by the planner's rule (validate.py). Checks,
    not recommendations: the comparison's one recommendation is planning.recommendation's, and
    trials' picks differ where their solo runs do. Empty without a checked trial."""
    checked = [(trial, t.planner["recommendation"])
               for trial, t in enumerate(result.trials_or_self)
               if t.planner and "recommendation" in t.planner]
    if not checked:
        return []
    picks = "; ".join(f"trial {trial} {r['predicted']} against {r['measured_winner'] or '—'}"
                      for trial, r in checked)
    agree = sum(r["predicted"] == r["measured_winner"] for _, r in checked)
    return ["", "Its pick checked in each trial, predicted from that trial's own solo runs "
            "against that trial's measured winner (the planner's rule: a more involved policy "
            f"must gain 5% over a simpler one): {picks} ({agree} of {len(checked)} agree)."]
