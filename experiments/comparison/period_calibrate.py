"""Job B's batch for an asked-for T_B/T_A (--period_ratio): short solo runs of job A and of
job B at the comparison's link until a batch of B steps within period_fit.TOLERANCE of the
ratio (period_fit.py's rule), and the batch re-picked for the next trial when a trial's solo
runs drift off it (the ratio held, as the M/C regime is)."""
from __future__ import annotations

import json
import pathlib
import statistics
import types
from typing import Any, Mapping

from absl import logging

from crossover_tf_planner import registry
from crossover_tf_planner.job_stats import JobStats
from experiments.comparison import calibrate
from experiments.comparison import period_fit as fit_lib


def largest(c: Any) -> int:
    """The largest batch job B may take (period_fit.MAX_BATCH_FACTOR times job A's)."""
    return fit_lib.MAX_BATCH_FACTOR * c.global_batch_size


def with_batch(c: Any, batch: int) -> Any:
    """The settings with job B at `batch`."""
    return types.SimpleNamespace(**{**vars(c), "job_b_global_batch_size": batch})


def _solo(c: Any, out: pathlib.Path, bandwidth: float | None, job: str, run_name: str
          ) -> JobStats:
    stats, _, _ = calibrate.solo_run(c, out / "period_calibration", bandwidth, run_name, job=job,
                                     emulated=False)
    return stats


def _fit(points: list[fit_lib.PeriodPoint]) -> fit_lib.StepFit:
    """The line through the points (what the hold rescales); through the origin from a
    single batch, or from points too noisy to give the step a positive slope."""
    try:
        return fit_lib.fit_step(points)
    except ValueError:
        return fit_lib.StepFit(0.0, statistics.fmean(p.step_s / p.batch for p in points))


def shape_job_b(c: Any, out: pathlib.Path, bandwidth: float | None
                ) -> tuple[Any, dict[str, Any], dict[str, JobStats]]:
    """The settings with job B's batch calibrated to --period_ratio, the calibration's record
    (also written to period_calibration/period_calibration.json) and the solo runs of A and
    of B at that batch (the planner's profiles before the trials). A ratio no point reached
    within the tolerance keeps the nearest batch, with a warning; the regime table then
    shows it."""
    asked, multiple = c.period_ratio, c.num_hosts
    solo_a = _solo(c, out, bandwidth, "A", "A")
    step_a = solo_a.step_time_s
    target = asked * step_a
    points: list[fit_lib.PeriodPoint] = []
    solos_b: dict[int, JobStats] = {}
    batch = c.job_b_global_batch_size or fit_lib.first_batch(c.global_batch_size, asked,
                                                             multiple)
    while len(points) < fit_lib.MAX_POINTS:
        solos_b[batch] = _solo(with_batch(c, batch), out, bandwidth, "B", f"B_{batch}")
        step_b = solos_b[batch].step_time_s
        points.append(fit_lib.PeriodPoint(batch, step_b))
        logging.info("period calibration: job B at batch %d steps %.0f ms, T_B/T_A %.2f "
                     "(asked %g)", batch, 1e3 * step_b, step_b / step_a, asked)
        if fit_lib.in_tolerance(step_b / step_a, asked):
            break
        try:
            batch = (fit_lib.second_batch(points[0], target, multiple) if len(points) == 1
                     else fit_lib.batch_for(fit_lib.fit_step(points), target, multiple,
                                            largest(c)))
        except ValueError as err:  # no batch reaches it: keep the nearest (warned below)
            logging.warning("period calibration stops: %s", err)
            break
        if batch in {p.batch for p in points} or batch > largest(c):
            break
    chosen = min(points, key=lambda p: abs(p.step_s / step_a / asked - 1))
    if not fit_lib.in_tolerance(chosen.step_s / step_a, asked):
        logging.warning("job B's period did not reach T_B/T_A %g within %.0f%%: batch %d gives "
                        "%.2f", asked, 100 * fit_lib.TOLERANCE, chosen.batch,
                        chosen.step_s / step_a)
    line = _fit(points)
    record = {"asked": asked, "step_a_s": step_a, "batch": chosen.batch,
              "points": [vars(p) for p in points],
              "fit": {"fixed_s": line.fixed_s, "per_image_s": line.per_image_s}}
    saved = out / "period_calibration" / "period_calibration.json"
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(record, indent=2))
    return with_batch(c, chosen.batch), record, {"A": solo_a, "B": solos_b[chosen.batch]}


def period_ratio(solos: Mapping[str, JobStats]) -> float:
    """T_B/T_A of one trial's solo runs (their median steps)."""
    return solos["B"].step_time_s / solos["A"].step_time_s


def next_batch(done: Mapping[str, Mapping[str, JobStats]], c: Any, record: Mapping[str, Any],
               trial: int) -> int:
    """Job B's batch for the trial after `done`: unchanged while its solo runs' T_B/T_A is
    within the tolerance, else re-picked from their steps (period_fit.rebatched)."""
    solos, batch = done[registry.SEQUENTIAL], c.job_b_global_batch_size
    achieved = period_ratio(solos)
    if fit_lib.in_tolerance(achieved, c.period_ratio):
        return batch
    try:
        rebatched = fit_lib.rebatched(fit_lib.StepFit(**record["fit"]), batch,
                                      solos["B"].step_time_s,
                                      c.period_ratio * solos["A"].step_time_s, c.num_hosts,
                                      largest(c))
    except ValueError as err:
        logging.warning("trial %d ran at T_B/T_A %.2f but job B's batch cannot follow (%s)",
                        trial, achieved, err)
        return batch
    logging.warning("trial %d ran at T_B/T_A %.2f against %g asked: job B's batch goes from %d "
                    "to %d for the next trial", trial, achieved, c.period_ratio, batch, rebatched)
    return rebatched
