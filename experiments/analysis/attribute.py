"""Where a crossed step's time goes, from the lease timelines of a comparison's jobs.

Crossing two jobs A and B ideally gives a round (one step of each) of
max(C_A, M_B) + max(C_B, M_A) with the solo compute C and allreduce M. The measured round is
longer; this module says by how much and why, for host 0 (where each job's rank 0 saved its
timeline), by splitting every ms of the device's time into

* each job's holds (compute, apply) — more than their solo holds when the other job's
  allreduce (Gloo's reduction, TCP, Horovod's and TensorFlow's threads) steals the core;
* hand-off gaps: nobody holds the device although a job has asked for it (the lease's own
  latency: wake-up, scheduling);
* idle between steps: nobody holds it or asks while a job is between its apply and its own
  next compute (Keras's Python between two steps): on the device's path when that job is the
  device's next user, as it is while the other job is in its allreduce;
* idle: nobody holds it and nobody asks, every job in its allreduce (or its turn's wait) —
  more than the ideal schedule's idle when allreduces stretch (straggling ranks, a shared link).

Each job's allreduce is split further, solo against crossed, from every rank's lease timeline
(train.py saves each rank's record): waiting for the job's last rank to arrive (a rank on the
other host still computing or waiting for its device) against the rest, from that rank's
arrival to the end (the transfer, stretched when another job's allreduce shares the link).
Horovod timelines (compare.py --horovod_timelines) split it the same way from Horovod's side
(negotiation against GLOO_ALLREDUCE), but their writer perturbs a CPU device.

  python -m experiments.attribute --dir=runs/compare    # writes attribution.{json,md}
"""
from __future__ import annotations

import pathlib
import re
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from absl import flags

from crossover_tf_planner import registry
from crossover_tf_planner.compare_record import Comparison
from crossover_tf_planner.job_stats import LEASE_TAGS, JobStats
from experiments import config as config_lib


def lease_events(stats: JobStats) -> np.ndarray:
    """[n, 4] (request, acquired, released, tag) ns: the saved events, or rebuilt from the step
    phases of stats saved before events were (a compute is taken as requested when the
    previous step's apply ended, so its wait is an upper bound)."""
    if stats.lease_events_ns:
        return np.asarray(stats.lease_events_ns, dtype=np.int64).reshape(-1, 4)
    p = _phases(stats)
    compute_request = np.concatenate([p[:1, 0], p[:-1, 4]])
    compute = np.stack([compute_request, p[:, 0], p[:, 1], np.ones(len(p), np.int64)], axis=1)
    apply = np.stack([p[:, 2], p[:, 3], p[:, 4], np.full(len(p), 2, np.int64)], axis=1)
    return np.stack([compute, apply], axis=1).reshape(-1, 4)


def _phases(stats: JobStats) -> np.ndarray:
    """[steps, 5] ns: compute acquired, compute released (the allreduce begins), apply
    requested (it has ended), apply acquired, apply released."""
    return np.asarray(stats.phases_ns, dtype=np.int64).reshape(-1, 5)


def allreduce_spans(stats: JobStats) -> np.ndarray:
    """[steps, 2] ns of each allreduce: its link turn (start, done) where the job took turns,
    else from the compute release to the apply request (which includes any wait for a turn)."""
    if stats.turn_events_ns:
        return np.asarray(stats.turn_events_ns, dtype=np.int64).reshape(-1, 4)[:, 1:3]
    return _phases(stats)[:, 1:3]


def _pieces(start_ns: int, end_ns: int, times: Iterable[np.ndarray]
            ) -> tuple[np.ndarray, np.ndarray]:
    """[start, end) cut at every one of `times` inside it: each piece's midpoint (ns) and
    width (s), so that a state that holds at a piece's midpoint holds over the whole piece."""
    inside = [t[(t > start_ns) & (t < end_ns)] for t in times]
    edges = np.unique(np.concatenate([[start_ns, end_ns], *inside]).astype(np.int64))
    return (edges[:-1] + edges[1:]) / 2, np.diff(edges) / 1e9


def device_time(events: Mapping[str, np.ndarray], start_ns: int, end_ns: int
                ) -> dict[str, float]:
    """Seconds of [start, end) the device spent in each job's holds (by tag), in hand-off
    gaps (free while a job waits), idle between steps (free, nobody waiting, a job between
    its apply and its next compute) and idle (free, nobody waiting, nobody between steps)."""
    if end_ns <= start_ns:
        raise ValueError("empty attribution window")
    mid, width = _pieces(start_ns, end_ns, (e[:, :3].ravel() for e in events.values()))
    held_by = np.full(len(mid), "", dtype=object)
    waiting = np.zeros(len(mid), dtype=bool)
    between = np.zeros(len(mid), dtype=bool)
    for job, e in events.items():
        for request, acquired, released, tag in e:
            released = released or end_ns
            held_by[(mid >= acquired) & (mid < released)] = f"{job} {LEASE_TAGS.get(int(tag))}"
            waiting |= (mid >= request) & (mid < acquired)
        for released, request in _between_steps(e):
            between |= (mid >= released) & (mid < request)
    out = {label: float(width[held_by == label].sum()) for label in sorted(set(held_by)) if label}
    free = held_by == ""
    out["hand-off gaps"] = float(width[free & waiting].sum())
    out[IDLE_BETWEEN_STEPS] = float(width[free & ~waiting & between].sum())
    out["idle"] = float(width[free & ~waiting & ~between].sum())
    return out


IDLE_BETWEEN_STEPS = "idle between steps"
_APPLY_TAG = next(tag for tag, name in LEASE_TAGS.items() if name == "apply")


def _between_steps(events: np.ndarray) -> list[tuple[int, int]]:
    """(apply released, next request) ns of one job: where it is between two steps."""
    ordered = events[np.argsort(events[:, 0], kind="stable")]
    return [(int(ordered[i, 2]), int(ordered[i + 1, 0])) for i in range(len(ordered) - 1)
            if int(ordered[i, 3]) == _APPLY_TAG and ordered[i, 2]]


def attribute(crossed: Mapping[str, JobStats], solo: Mapping[str, JobStats],
              warmup_steps: int) -> dict[str, Any]:
    """Per round (one step of each job) on host 0: measured and ideal round, the device's
    time split as in the module docstring against the solo holds, and each job's median
    allreduce crossed against solo."""
    if len(crossed) != 2:
        raise ValueError(f"the round attribution is for a crossed pair, got {len(crossed)} jobs")
    if any(len(s.step_end_ns) <= warmup_steps + 1 for s in crossed.values()):
        raise ValueError("the jobs did not overlap for a whole step after warm-up")
    start = max(s.step_end_ns[warmup_steps] for s in crossed.values())
    end = min(s.step_end_ns[-1] for s in crossed.values())
    ends = {job: np.asarray(s.step_end_ns) for job, s in crossed.items()}
    steps = np.mean([np.count_nonzero((e > start) & (e <= end)) for e in ends.values()])
    if steps < 1:
        raise ValueError("the jobs did not overlap for a whole step after warm-up")
    per_round = {k: v / steps for k, v in
                 device_time({j: lease_events(s) for j, s in crossed.items()}, start, end).items()}
    a, b = (solo[job] for job in crossed)
    ideal = max(a.device_s, b.comm_s) + max(b.device_s, a.comm_s)
    measured = (end - start) / 1e9 / steps
    solo_holds = a.device_s + b.device_s
    holds = sum(v for k, v in per_round.items()
                if k not in ("hand-off gaps", "idle", IDLE_BETWEEN_STEPS))
    # The ideal schedule idles (ideal - solo holds) per round; the idle beyond it is put on
    # the steps' Python first, as far as it goes, then on the allreduces.
    beyond = per_round["idle"] + per_round[IDLE_BETWEEN_STEPS] - (ideal - solo_holds)
    python = min(per_round[IDLE_BETWEEN_STEPS], max(beyond, 0.0))
    loss = {"holds longer than solo (CPU contention)": holds - solo_holds,
            "hand-off gaps": per_round["hand-off gaps"],
            "idle between a job's steps (its Python)": python,
            "idle beyond the ideal schedule's": beyond - python}
    comm = {job: {"solo_ms": 1e3 * solo[job].comm_s, "crossed_ms": 1e3 * s.comm_s,
                  "wait_for_apply_ms": 1e3 * (s.wait_s or 0.0)}
            for job, s in crossed.items()}
    overlap = allreduce_overlap(crossed, start, end)
    if overlap:
        overlap["in_flight_ms_per_round"] = 1e3 * overlap.pop("in_flight_s") / steps
        overlap["solo_back_to_back_ms"] = 1e3 * (a.comm_s + b.comm_s)
    return {"round_ms": 1e3 * measured, "ideal_round_ms": 1e3 * ideal,
            "loss_ms": 1e3 * (measured - ideal), "rounds": float(steps),
            "device_ms_per_round": {k: 1e3 * v for k, v in per_round.items()},
            "solo_holds_ms": {job: 1e3 * solo[job].device_s for job in crossed},
            "loss_by_cause_ms": {k: 1e3 * v for k, v in loss.items()},
            "hand-offs_per_round": _handoffs(crossed, start, end) / steps,
            "allreduce": comm, **({"allreduce_overlap": overlap} if overlap else {})}


def allreduce_overlap(crossed: Mapping[str, JobStats], start_ns: int, end_ns: int
                      ) -> dict[str, Any]:
    """How the crossed jobs' allreduces (allreduce_spans, rank 0) sat on the link in
    [start, end): seconds with at least one in flight, and the share of each job's
    allreduce time that the other job's allreduces overlapped. Allreduces that overlap
    stretch; if they also move less than back to back, the round grows past the ideal.
    Empty for stats without step phases."""
    spans = {j: allreduce_spans(s) for j, s in crossed.items()}
    if any(len(v) == 0 for v in spans.values()):
        return {}
    mid, width = _pieces(start_ns, end_ns, (v.ravel() for v in spans.values()))
    running = {j: ((mid[:, None] >= v[:, 0]) & (mid[:, None] < v[:, 1])).any(axis=1)
               for j, v in spans.items()}
    overlapped = {}
    for job, mine in running.items():
        others = np.any([r for j, r in running.items() if j != job], axis=0)
        own = width[mine].sum()
        overlapped[job] = float(width[mine & others].sum() / own) if own else 0.0
    return {"in_flight_s": float(width[np.any(list(running.values()), axis=0)].sum()),
            "overlapped_fraction": overlapped}


def allreduce_split(ranks: Sequence[JobStats], warmup_steps: int) -> dict[str, float]:
    """One job's allreduce on its first rank (median ms per step after warm-up): in all,
    waiting for the job's last rank to arrive, and from that arrival to the end.

    A rank's allreduce runs from its compute release to its apply request (step phases 1 and
    2). The emulated hosts share one clock, so the ranks' timestamps compare directly; on a
    real cluster they would need synchronised clocks.
    """
    if len(ranks) < 2:
        raise ValueError(f"splitting an allreduce needs every rank's timeline, got {len(ranks)}")
    phases = [_phases(s)[warmup_steps:] for s in ranks]
    steps = min(len(p) for p in phases)
    if steps < 1:
        raise ValueError("no step after warm-up in every rank's timeline")
    own = phases[0][:steps]
    last = np.max([p[:steps, 1] for p in phases], axis=0)
    return {"total_ms": float(np.median(own[:, 2] - own[:, 1])) / 1e6,
            "wait_for_last_rank_ms": float(np.median(last - own[:, 1])) / 1e6,
            "after_last_rank_ms": float(np.median(own[:, 2] - last)) / 1e6}


def rank_stats(job_dir: pathlib.Path, first: JobStats) -> list[JobStats]:
    """A job's records in rank order: `first` (rank 0's, from compare.json), then the
    stats.rank<r>.json files train.py wrote beside its stats.json (none before it did)."""
    found = {}
    for path in list(job_dir.glob("stats.rank*.json"))[:64]:
        match = re.fullmatch(r"stats\.rank(\d+)\.json", path.name)
        if match:
            found[int(match.group(1))] = JobStats.from_json(path)
    return [first, *(found[r] for r in sorted(found))]


Runs = Mapping[str, tuple[str, Mapping[str, JobStats]]]  # label: (scenario, each job's stats)


def _rank_splits(tensorboard: pathlib.Path, trial: int, runs: Runs, warmup_steps: int
                 ) -> dict[str, Any]:
    """allreduce_split of each job in each run (solo, crossed) whose other ranks' records
    were saved."""
    splits: dict[str, dict[str, Any]] = {}
    for run, (scenario, jobs) in runs.items():
        for job, first in jobs.items():
            ranks = rank_stats(tensorboard / f"t{trial}_{scenario}" / job, first)
            if len(ranks) > 1:
                splits.setdefault(job, {})[run] = allreduce_split(ranks, warmup_steps)
    return {"allreduce_split": splits} if splits else {}


def _handoffs(crossed: Mapping[str, JobStats], start: int, end: int) -> int:
    """Acquisitions in the window that followed another job's hold."""
    holds = sorted((int(e[1]), job) for job, s in crossed.items() for e in lease_events(s)
                   if start <= e[1] < end)
    return sum(1 for (_, prev), (_, cur) in zip(holds, holds[1:]) if prev != cur)


def from_comparison(result: Comparison, trial: int | None = None,
                    out_dir: str | pathlib.Path | None = None,
                    scenario: str = registry.CROSSOVER) -> dict[str, Any]:
    """The attribution of one trial (default: the representative one) of a compare.json's
    crossed `scenario` (crossover, or crossover_turn); with `out_dir` (where compare.py wrote
    it), also every rank's records and the Horovod timelines found there."""
    trial = result.representative_trial if trial is None else trial
    scenarios = result.trials_or_self[trial].scenarios
    if scenario not in scenarios:
        raise ValueError(f"the comparison has no {scenario} scenario to attribute")
    crossed = dict(scenarios[scenario].jobs)
    solo = {j: scenarios[registry.solo(j)].jobs[j] for j in crossed}
    warmup = int(result.settings["warmup_steps"])
    out = {"trial": trial, "scenario": scenario, **attribute(crossed, solo, warmup)}
    if len(result.trials_or_self) > 1:
        out["every_trial"] = every_trial(result, scenario)
    if out_dir is not None:
        tensorboard = pathlib.Path(out_dir) / "tensorboard"
        runs = {"solo": ("sequential", solo), "crossed": (scenario, crossed)}
        out.update(_rank_splits(tensorboard, trial, runs, warmup))
        out.update(_horovod_phases(tensorboard, trial, runs, warmup))
    return out


def every_trial(result: Comparison, scenario: str) -> list[dict[str, Any]]:
    """Each trial's round and its loss by cause: the representative trial alone can be the
    best or the worst of them (one trial's contention was 13 ms per round, another's 199)."""
    warmup = int(result.settings["warmup_steps"])
    rows = []
    for trial, record in enumerate(result.trials_or_self):
        if scenario not in record.scenarios:
            continue
        crossed = dict(record.scenarios[scenario].jobs)
        try:
            solo = {j: record.scenarios[registry.solo(j)].jobs[j] for j in crossed}
            a = attribute(crossed, solo, warmup)
        except (KeyError, ValueError) as err:  # no solo run, or no whole crossed step
            rows.append({"trial": trial, "error": str(err)})
            continue
        rows.append({"trial": trial, **{k: a[k] for k in ("round_ms", "ideal_round_ms",
                                                          "loss_ms", "loss_by_cause_ms")}})
    return rows


def _trials_markdown(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The loss by cause of every trial, one row each, and their median."""
    done = [r for r in rows if "error" not in r]
    if not done:
        return []
    causes = list(done[0]["loss_by_cause_ms"])
    lines = ["", "Every trial (ms per round):", "",
             "| trial | measured | ideal | loss | " + " | ".join(causes) + " |",
             "|---|---:|---:|---:|" + "---:|" * len(causes)]

    def row(name: str, values: Sequence[float]) -> str:
        return f"| {name} | " + " | ".join(f"{v:.1f}" for v in values[:3]) + " | " \
            + " | ".join(f"{v:+.1f}" for v in values[3:]) + " |"
    table = [[r["round_ms"], r["ideal_round_ms"], r["loss_ms"],
              *(r["loss_by_cause_ms"][c] for c in causes)] for r in done]
    lines += [row(str(r["trial"]), v) for r, v in zip(done, table)]
    lines.append(row("median", list(np.median(np.asarray(table), axis=0))))
    lines += [f"| {r['trial']} | {r['error']} |" for r in rows if "error" in r]
    return lines


def _horovod_phases(tensorboard: pathlib.Path, trial: int, runs: Runs, warmup_steps: int
                    ) -> dict[str, Any]:
    """Each job's median allreduce phases from its solo and crossed Horovod timelines."""
    from experiments.analysis import horovod_timeline
    phases: dict[str, dict[str, Any]] = {}
    for scenario, jobs in runs.values():
        for job in jobs:
            path = tensorboard / f"t{trial}_{scenario}" / job / "horovod_timeline.json"
            if path.exists():
                phases.setdefault(job, {})[scenario] = horovod_timeline.summary(path,
                                                                                warmup_steps)
    return {"horovod": phases} if phases else {}


def markdown(attribution: Mapping[str, Any]) -> str:
    a = attribution
    lines = [f"Scenario {a.get('scenario', 'crossover')}. "
             f"Round (one step of each job, host 0): measured {a['round_ms']:.1f} ms, ideal "
             f"{a['ideal_round_ms']:.1f} ms, loss {a['loss_ms']:.1f} ms "
             f"({a['hand-offs_per_round']:.2f} hand-offs per round, trial {a['trial']}).", "",
             "| device time per round | ms |", "|---|---:|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in a["device_ms_per_round"].items()]
    lines += [f"| (solo holds: {', '.join(f'{j} {v:.1f}' for j, v in a['solo_holds_ms'].items())}"
              ") | |", "", "| loss by cause | ms per round |", "|---|---:|"]
    lines += [f"| {k} | {v:+.1f} |" for k, v in a["loss_by_cause_ms"].items()]
    lines += ["", "| job | allreduce solo (ms) | allreduce crossed (ms) | wait for apply (ms) |",
              "|---|---:|---:|---:|"]
    lines += [f"| {j} | {c['solo_ms']:.1f} | {c['crossed_ms']:.1f} | {c['wait_for_apply_ms']:.1f} |"
              for j, c in a["allreduce"].items()]
    if a.get("allreduce_overlap"):
        o = a["allreduce_overlap"]
        lines += ["", f"Allreduces on the link (host 0): some allreduce in flight "
                  f"{o['in_flight_ms_per_round']:.1f} ms per round; the solo allreduces back to "
                  f"back take {o['solo_back_to_back_ms']:.1f} ms; overlapped by the other job's: "
                  + ", ".join(f"{j} {100 * f:.0f}%" for j, f in o["overlapped_fraction"].items())
                  + "."]
    if a.get("allreduce_split"):
        lines += ["", "Allreduce on rank 0 from every rank's timeline (median ms per step):", "",
                  "| job | run | allreduce | waiting for the last rank | after its arrival |",
                  "|---|---|---:|---:|---:|"]
        lines += [f"| {job} | {run} | {s['total_ms']:.1f} | {s['wait_for_last_rank_ms']:.1f} | "
                  f"{s['after_last_rank_ms']:.1f} |"
                  for job, runs in a["allreduce_split"].items() for run, s in runs.items()]
    if a.get("horovod"):
        lines += ["", "Horovod timeline (rank 0, median ms per step):", "",
                  "| job | run | negotiate (waiting for other ranks) | allreduce | transfer "
                  "(GLOO_ALLREDUCE) | total |", "|---|---|---:|---:|---:|---:|"]
        lines += [f"| {job} | {run} | {p['negotiate_ms']:.1f} | {p['allreduce_ms']:.1f} | "
                  f"{p['transfer_ms']:.1f} | {p['total_ms']:.1f} |"
                  for job, runs in a["horovod"].items() for run, p in runs.items()]
    lines += _trials_markdown(a.get("every_trial", ()))
    return "\n".join(lines) + "\n"


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    define = config_lib.flag_definer(flag_values)
    define(flags.DEFINE_string, "dir", "runs/compare", "A compare.py --out_dir.")
    define(flags.DEFINE_integer, "trial", None, "Trial to attribute (default: representative).")


FLAG_NAMES = config_lib.defined_names(define_flags)


def run(flag_values: flags.FlagValues = flags.FLAGS,
        overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    define_flags(flag_values)
    c = config_lib.resolve(flag_values, FLAG_NAMES, overrides, lambda c: None, "attribute")
    out = pathlib.Path(c.dir)
    attribution = from_comparison(Comparison.from_json(out / "compare.json"), c.trial, out)
    config_lib.write_results(out, "attribution", attribution, markdown(attribution))
    return attribution


main = config_lib.script_main(run)
