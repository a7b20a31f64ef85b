"""Cluster-scale extrapolation: plan pairs for many jobs, place them, simulate.

Every group (a planned pair, or two jobs the plan left unpaired, which then
time-share as ``sequential``) gets its own block of hosts, and each job spans
the whole block.  The same placement is simulated under each uniform policy
and under ``planned`` (each group runs what the planner recommended), and the
simulated totals are set against the analytical sums.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from crossover_tf_planner.analytical import PairPrediction, predict_pairs
from crossover_tf_planner.pairing import plan_pairs
from crossover_tf_planner.policies import POLICIES, recommended_policy
from crossover_tf_planner.profile import JobProfile
from crossover_tf_planner.simulator import SimJob, simulate

CLUSTER_POLICIES = POLICIES + ("planned",)


def synthetic_profiles(n_jobs: int, *, seed: int = 0, period_s: tuple[float, float] = (0.05, 0.2),
                       cm_ratio: tuple[float, float] = (0.2, 5.0), cv: float = 0.05,
                       handoff_s: float = 2e-4) -> list[JobProfile]:
    """A reproducible job mix: log-uniform periods and compute/comm ratios."""
    if n_jobs < 1:
        raise ValueError("n_jobs must be >= 1")
    rng = np.random.default_rng(seed)
    periods = np.exp(rng.uniform(*np.log(period_s), n_jobs))
    ratios = np.exp(rng.uniform(*np.log(cm_ratio), n_jobs))
    return [JobProfile(name=f"job{i:02d}", compute_s=float(t * r / (1 + r)),
                       comm_s=float(t / (1 + r)), compute_std_s=float(cv * t * r / (1 + r)),
                       comm_std_s=float(cv * t / (1 + r)), handoff_s=handoff_s,
                       images_per_step=64.0, source="synthetic")
            for i, (t, r) in enumerate(zip(periods, ratios))]


def group_jobs(profiles: Sequence[JobProfile], **plan_kwargs: Any) -> list[PairPrediction]:
    """Planned pairs first, then the unpaired jobs two by two (an odd one is left out)."""
    plan = plan_pairs(profiles, **plan_kwargs)
    by_name = {p.name: p for p in profiles}
    leftovers = [by_name[n] for n in plan.unpaired]
    extra = list(zip(leftovers[0::2], leftovers[1::2]))
    forced = predict_pairs(extra, **plan_kwargs) if extra else []
    forced = [PairPrediction(**{**p.to_dict(), "recommendation": "do not pair"}) for p in forced]
    return plan.pairs + forced


def place(groups: Sequence[PairPrediction], profiles: Sequence[JobProfile], n_hosts: int,
          policy: str) -> list[SimJob]:
    """One disjoint block of hosts per group; ``policy='planned'`` uses each group's
    recommendation, ``shift`` starts job B at the offset the shift rule predicts (shift_rule.py)."""
    if not groups:
        raise ValueError("no job groups to place")
    per_group = n_hosts // len(groups)
    if per_group < 1:
        raise ValueError(f"{len(groups)} groups do not fit on {n_hosts} hosts")
    by_name = {p.name: p for p in profiles}
    jobs = []
    for index, group in enumerate(groups):
        hosts = tuple(range(index * per_group, (index + 1) * per_group))
        chosen = recommended_policy(group.recommendation) if policy == "planned" else policy
        offset = group.shift_offset_s if chosen == "shift" else 0.0
        jobs.append(SimJob(by_name[group.job_a], hosts, chosen))
        jobs.append(SimJob(by_name[group.job_b], hosts, chosen, start_s=offset))
    return jobs


def run_cluster(profiles: Sequence[JobProfile], n_hosts: int, *, steps: int = 60,
                seed: int = 0, policies: Sequence[str] = CLUSTER_POLICIES) -> dict[str, Any]:
    """Simulates the planned placement under each policy; totals are in solo-job
    equivalents (sum of normalised throughputs) and images/s."""
    groups = group_jobs(profiles)
    out: dict[str, Any] = {"n_hosts": n_hosts, "n_jobs": len(profiles), "groups": len(groups),
                           "hosts_per_job": n_hosts // len(groups), "policies": {}}
    for policy in policies:
        started = time.perf_counter()
        result = simulate(place(groups, profiles, n_hosts, policy), n_hosts, steps=steps,
                          seed=seed)
        summary = result.summary()
        predicted = sum(g.normalised[recommended_policy(g.recommendation)
                                     if policy == "planned" else policy] for g in groups)
        simulated = summary["normalised_total"]
        out["policies"][policy] = {
            "simulated_normalised_total": simulated,
            "analytical_normalised_total": predicted,
            "analytical_vs_simulated_error_pct": 100.0 * (predicted - simulated) / simulated,
            "images_per_s": summary["images_per_s"], "events": summary["events"],
            "max_device_flows": summary["max_device_flows"],
            "max_link_rate": summary["max_link_rate"],
            "wall_s": time.perf_counter() - started}
    return out


def to_markdown(report: dict[str, Any]) -> str:
    lines = [f"{report['n_jobs']} jobs in {report['groups']} groups on {report['n_hosts']} hosts "
             f"({report['hosts_per_job']} hosts per job).", "",
             "| policy | simulated (solo-job eq.) | analytical | error % | images/s | wall s |",
             "|---|---|---|---|---|---|"]
    for policy, row in report["policies"].items():
        lines.append(f"| {policy} | {row['simulated_normalised_total']:.2f} | "
                     f"{row['analytical_normalised_total']:.2f} | "
                     f"{row['analytical_vs_simulated_error_pct']:+.1f} | "
                     f"{row['images_per_s']:.0f} | {row['wall_s']:.2f} |")
    return "\n".join(lines)
