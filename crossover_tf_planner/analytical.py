"""Predicted throughput of two jobs sharing devices and a link, under four policies.

Throughput of a pair is reported *normalised*: the sum over the two jobs of
(steps/s in the pair) / (steps/s alone).  It counts "solo-job equivalents", so
jobs of different sizes weigh the same and 2.0 is the ceiling (both jobs at
full solo speed on one set of devices).

* sequential: time multiplexing, each job gets the devices and link half the
  time at solo speed -> exactly 1.0.  It is the baseline for "does pairing pay".
* naive: both jobs run freely on shared devices (processor sharing, each gets
  ``device_efficiency / 2`` when both compute) and a shared link (equal
  bandwidth share); the fluid steady state is averaged over uniformly random
  start offsets, because nothing controls the phase.
* shift (CASSINI-style): the same co-location, but the second job starts at the
  static offset CASSINI's rule picks (shift_rule.py: the periods aligned on their
  LCM, the offset that keeps the allreduces apart longest), the offset the
  comparison's shift scenario runs; each job keeps its own period and contention
  stretches whatever still overlaps.
* crossover: the device is under a FIFO lease (a hand-off costs h of device
  time) and the link is still shared, as the lease strategy does; the fluid
  steady state is averaged over start offsets like naive.  The lease is
  work-conserving: a job whose allreduce ends while the other job is still
  communicating takes the device again, so the faster job may do more steps.
Those are the ``gpu`` device model's policies (device_models.py). On the ``cpu`` model (one
time-sliced core per host) naive co-location keeps the core busy: a round of one step per job
takes ``max(U_A + U_B, (M_A + M_B) / eta, T_A, T_B)`` with U the CPU seconds a step uses
(``cpu_demand_s``), eta the link's shared efficiency (below) and T the solo step; a shift
cannot improve on that. Crossover serialises the device holds instead, and each hold also
carries the CPU the other job's allreduce takes meanwhile (X, ``comm_cpu_s``):
``max(D_A + D_B + 2h + X_A + X_B, U_A + U_B, (M_A + M_B) / eta, D_A + h + M_A + O_A,
D_B + h + M_B + O_B)``; with link turns the same with eta = 1. A hold longer than the CPU it
uses (a step that waits inside it) is what makes naive win on a CPU where the core bounds the
round; the link's contention is what makes crossing with turns win where the link does.

* crossover_turn: crossover with link turns (CrossoverStrategy(link_turn=...)): strict A, B
  alternation with the allreduces also taking turns on the link, one step per job per
  round; the round is the max-plus cycle time of that schedule::

      R = max(D_A + D_B + 2h, M_A + M_B, D_A + h + M_A + O_A, D_B + h + M_B + O_B)

  (D device time incl. apply, M allreduce, O other).  Without O it equals
  ``max(D_A + h, M_B) + max(D_B + h, M_A)``.  With variance, R is the mean of that
  expression over sampled rounds.  The real lease can beat it (extra turns for
  the faster job) or fall short of it (an allreduce started while the other
  job's is still running shares the link); ``crossover`` models both.

Link contention (comm_cost.LinkContention, measured by comm_cpu.measure_contention) enters every
model the same way. Allreduces that overlap at random, as under naive co-location and plain
crossing, move ``shared_efficiency`` (eta) of what the link moves for one job: the shared link
runs at eta/2 per job in the fluid model, and the link bound of a round becomes
``(M_A + M_B) / eta`` in the cpu model. Link turns never overlap two allreduces, so
crossover_turn keeps eta = 1. On the cpu model an allreduce also takes ``compute_slowdown``
(kappa) times as long while its core computes, for the share of the round the core is busy
(``U / R``): each allreduce counts ``1 + (kappa - 1) * min(1, U / R)`` times its solo length,
with R the round it is in (a fixed point, a few iterations).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

from crossover_tf_planner import fluid, json_io, shift_rule
from crossover_tf_planner.comm_cost import NO_CONTENTION, LinkContention
from crossover_tf_planner.device_models import DeviceModel, device_model, limitation_of
from crossover_tf_planner.policies import PREDICTED
from crossover_tf_planner.profile import JobProfile



@dataclasses.dataclass(frozen=True)
class PairTimes:
    """Phase times of many job pairs as arrays of shape (n, 2), for vectorised models."""

    device_s: np.ndarray
    link_s: np.ndarray
    other_s: np.ndarray
    handoff_s: np.ndarray
    device_std_s: np.ndarray
    link_std_s: np.ndarray
    comm_cpu_s: np.ndarray
    cpu_s: np.ndarray  # CPU demand per step (JobProfile.cpu_demand_s)

    @classmethod
    def from_profiles(cls, pairs: Sequence[tuple[JobProfile, JobProfile]]) -> "PairTimes":
        if not pairs:
            raise ValueError("need at least one pair of job profiles")

        def column(attr: str) -> np.ndarray:
            return np.array([[getattr(a, attr), getattr(b, attr)] for a, b in pairs], float)

        return cls(column("device_s"), column("comm_s"), column("other_s"),
                   column("handoff_s"), column("compute_std_s"), column("comm_std_s"),
                   column("comm_cpu_s"), column("cpu_demand_s"))

    @property
    def period_s(self) -> np.ndarray:
        return self.device_s + self.link_s + self.other_s


def crossover_round_s(times: PairTimes, *, samples: int = 0, seed: int = 0,
                      comm_cpu: bool = False) -> np.ndarray:
    """Mean crossed-round time per pair, shape (n,); ``samples > 0`` adds variance;
    ``comm_cpu`` puts each allreduce's CPU time on the shared device too (cpu model)."""
    device, link = times.device_s + times.handoff_s, times.link_s
    if samples > 0:
        rng = np.random.default_rng(seed)
        shape = device.shape + (samples,)
        device = np.maximum(0.0, device[..., None] + times.device_std_s[..., None]
                            * rng.standard_normal(shape))
        link = np.maximum(0.0, link[..., None] + times.link_std_s[..., None]
                          * rng.standard_normal(shape))
        other = times.other_s[..., None]
    else:
        other = times.other_s
    stolen = times.comm_cpu_s.sum(axis=1) if comm_cpu else np.zeros(len(times.device_s))
    if samples > 0:
        stolen = stolen[:, None]
    rounds = np.maximum.reduce([
        device[:, 0] + device[:, 1] + stolen,
        link[:, 0] + link[:, 1],
        device[:, 0] + link[:, 0] + other[:, 0],
        device[:, 1] + link[:, 1] + other[:, 1],
    ])
    return rounds.mean(axis=-1) if samples > 0 else rounds


def shift_offsets_s(times: PairTimes, n_offsets: int) -> np.ndarray:
    """Start offsets of job 1 that naive co-location averages over, shape (n, k): a grid
    over job 0's period plus the natural interleave (job 1 computes while job 0
    communicates)."""
    if n_offsets < 1:
        raise ValueError("n_offsets must be >= 1")
    grid = np.arange(n_offsets) / n_offsets
    offsets = times.period_s[:, :1] * grid[None, :]
    return np.concatenate([offsets, times.device_s[:, :1]], axis=1)


def rule_shifts_s(times: PairTimes) -> np.ndarray:
    """The offset CASSINI's rule (shift_rule.choose_shift) starts job 1 at, per pair, (n,)."""
    return np.array([shift_rule.choose_shift(
        shift_rule.StepPhases(d[0], m[0], o[0]), shift_rule.StepPhases(d[1], m[1], o[1])
    ).shift_s for d, m, o in zip(times.device_s, times.link_s, times.other_s)])


def policy_steps_per_s(times: PairTimes, *, n_offsets: int = 8,
                       device_efficiency: float | None = None, samples: int = 0, seed: int = 0,
                       n_events: int = 1200, model: str | DeviceModel = "gpu",
                       contention: LinkContention = NO_CONTENTION) -> dict[str, np.ndarray]:
    """Steps/s of each job (shape (n, 2)) under every policy in ``PREDICTED``, plus
    the chosen shift offset (``"shift_offset_s"``, shape (n,)), on device ``model``
    (``device_efficiency`` overrides the model's) with the link's measured ``contention``."""
    model = device_model(model, device_efficiency)
    if model.naive_sharing == "work-conserving":
        return _work_conserving_steps_per_s(times, samples=samples, seed=seed,
                                            comm_cpu=model.comm_on_device,
                                            contention=contention)
    device_efficiency = model.device_efficiency
    period = times.period_s
    offsets = np.concatenate([shift_offsets_s(times, n_offsets), rule_shifts_s(times)[:, None]],
                             axis=1)  # the last column is the shift's, the others naive's
    n, k = offsets.shape
    work = np.repeat(np.stack([times.device_s, times.link_s, times.other_s], axis=2), k, axis=0)

    def per_offset(leased: bool) -> np.ndarray:
        return fluid.colocated_steps_per_s(
            work, offsets.reshape(-1), leased=leased,
            handoff_s=np.repeat(times.handoff_s, k, axis=0),
            device_efficiency=device_efficiency, n_events=n_events,
            link_efficiency=contention.shared_efficiency).reshape(n, k, 2)

    free = per_offset(leased=False)
    ideal = 1.0 / crossover_round_s(times, samples=samples, seed=seed)
    return {
        "sequential": 0.5 / period,
        "naive": free[:, :-1].mean(axis=1),
        "shift": free[:, -1],
        "crossover": per_offset(leased=True)[:, :-1].mean(axis=1),
        "crossover_turn": np.repeat(ideal[:, None], 2, axis=1),
        "shift_offset_s": offsets[:, -1],
    }


def _work_conserving_steps_per_s(times: PairTimes, *, samples: int, seed: int, comm_cpu: bool,
                                 contention: LinkContention) -> dict[str, np.ndarray]:
    """The policies on a time-sliced core: naive (and any shift) keep the core busy whenever a
    job has work, so a round (one step of each) is bounded only by the CPU both steps use, the
    link both allreduces use (at the shared efficiency: nothing keeps them apart) and each
    job's own step; crossover serialises the holds (crossover_round_s) and is bounded by the
    same CPU work and the same shared link; with link turns the link carries one allreduce at
    a time. Allreduces are slowed while the core computes (module docstring)."""
    cpu = times.cpu_s.sum(axis=1)
    slowdown = contention.compute_slowdown if comm_cpu else 1.0
    eta = contention.shared_efficiency

    def naive_round(link: np.ndarray) -> np.ndarray:
        return np.maximum.reduce([cpu, link.sum(axis=1) / eta,
                                  (times.device_s + link + times.other_s).max(axis=1)])

    def crossed_round(link: np.ndarray, efficiency: float) -> np.ndarray:
        slowed = dataclasses.replace(times, link_s=link)
        return np.maximum.reduce([
            crossover_round_s(slowed, samples=samples, seed=seed, comm_cpu=comm_cpu), cpu,
            link.sum(axis=1) / efficiency])

    rounds = {"naive": _with_slowed_allreduces(naive_round, times.link_s, cpu, slowdown),
              "crossover": _with_slowed_allreduces(
                  lambda link: crossed_round(link, eta), times.link_s, cpu, slowdown),
              "crossover_turn": _with_slowed_allreduces(
                  lambda link: crossed_round(link, 1.0), times.link_s, cpu, slowdown)}
    both = np.ones((1, 2))
    return {"sequential": 0.5 / times.period_s,
            **{name: (1.0 / r)[:, None] * both for name, r in rounds.items()},
            "shift": (1.0 / rounds["naive"])[:, None] * both,
            "shift_offset_s": rule_shifts_s(times)}


def _with_slowed_allreduces(round_s, link_s: np.ndarray, cpu_s: np.ndarray, slowdown: float,
                            iterations: int = 30) -> np.ndarray:
    """The round R = round_s(link) whose allreduces last ``1 + (slowdown - 1) * min(1,
    cpu_s / R)`` times their solo ``link_s``: the fixed point, from the unslowed round (R
    grows with the factor and the factor shrinks with R, so the iterates close in on it;
    damped so that they do not oscillate)."""
    rounds = round_s(link_s)
    if slowdown == 1.0:
        return rounds
    for _ in range(iterations):
        factor = 1 + (slowdown - 1) * np.minimum(1.0, cpu_s / rounds)
        rounds = 0.5 * (rounds + round_s(link_s * factor[:, None]))
    return rounds


def normalised_throughput(steps_per_s: np.ndarray, times: PairTimes) -> np.ndarray:
    """Sum over the pair of steps/s relative to solo steps/s, shape (n,)."""
    return (steps_per_s * times.period_s).sum(axis=1)


def hyperperiod_s(period_a: float, period_b: float, quantum_s: float = 1e-3) -> float:
    """LCM of the two periods after quantising them to ``quantum_s`` (as CASSINI does)."""
    qa, qb = max(1, round(period_a / quantum_s)), max(1, round(period_b / quantum_s))
    return math.lcm(qa, qb) * quantum_s


TIE = 1e-3  # crossover and shift within 0.1% of each other are a tie (model noise)


CROSSING = ("crossover", "crossover_turn", "shift")  # in order of preference in a tie


def recommend(normalised: Mapping[str, float], min_gain: float = 0.05) -> tuple[str, str]:
    """Picks do-not-pair, naive, cross or shift from normalised throughputs, with a reason.

    The simplest way wins unless a more involved one beats it by ``min_gain``: running the
    jobs one after the other, then naive co-location (no scheduler), then the best of
    crossover, crossover with link turns and shift (a tie goes to crossover, then to link
    turns: the lease holds its schedule by construction, a shift has to be kept in place
    against run-time noise). Both crossovers are "cross"; ``recommended`` says which one.
    Policies missing from ``normalised`` (a measurement without shift) are not candidates, so
    the same rule names the measured winner of a comparison.
    """
    choice, _, reason = recommended(normalised, min_gain)
    return choice, reason


def recommended(normalised: Mapping[str, float], min_gain: float = 0.05
                ) -> tuple[str, str, str]:
    """``recommend``'s choice, the policy it runs (crossover_turn: cross with link turns)
    and its reason."""
    normalised = {"sequential": 1.0, **normalised}  # one after the other is 1 by definition
    colocated = [p for p in CROSSING if p in normalised]
    ladder = [("do not pair", "sequential"), ("naive", "naive")] if "naive" in normalised \
        else [("do not pair", "sequential")]
    if colocated:
        best = max(colocated, key=lambda p: normalised[p] * (
            1 + TIE * (len(CROSSING) - CROSSING.index(p))))
        ladder.append(("shift" if best == "shift" else "cross", best))
    choice, policy = ladder[0]
    for candidate, candidate_policy in ladder[1:]:
        if normalised[candidate_policy] >= normalised[policy] * (1 + min_gain):
            choice, policy = candidate, candidate_policy
    gains = ", ".join(f"{normalised[policy] / normalised[p] - 1:+.1%} over {p}"
                      for _, p in ladder if p != policy)
    return choice, policy, (
        f"{policy} ({normalised[policy]:.3f} solo-job equivalents) gains {gains}; a more "
        f"involved policy must gain {min_gain:.0%} over a simpler one")


@dataclasses.dataclass(frozen=True)
class PairPrediction(json_io.JsonResult):
    """What the planner predicts for one pair of jobs (``crossover_tf_planner.recommend``'s
    result: a scheduler reads its ``to_json``)."""

    job_a: str
    job_b: str
    device_model: str
    normalised: dict[str, float]
    images_per_s: dict[str, float]
    steps_per_s: dict[str, list[float]]
    shift_offset_s: float
    hyperperiod_s: float
    recommendation: str
    expected_gain: float
    gain_vs_naive: float
    reason: str
    policy: str = ""  # the policy the recommendation runs (crossover_turn: with link turns)

    @property
    def best_policy(self) -> str:
        return self.policy

    def to_markdown(self) -> str:
        """The recommendation in one sentence, then each policy's predicted throughput."""
        rows = "\n".join(f"| {p} | {v:.3f} | {self.images_per_s[p]:.1f} |"
                         for p, v in self.normalised.items())
        turns = " (with link turns)" if self.policy == "crossover_turn" else ""
        limitation = limitation_of(self.device_model)
        return (f"**{self.recommendation}**{turns} for {self.job_a} + {self.job_b}: "
                f"{self.reason}.\n\n| policy | solo-job equivalents | images/s |\n"
                f"|---|---|---|\n{rows}" + (f"\n\n{limitation}" if limitation else ""))


def predict_pairs(pairs: Sequence[tuple[JobProfile, JobProfile]], *, min_gain: float = 0.05,
                  n_offsets: int = 8, device_efficiency: float | None = None,
                  samples: int = 2048, seed: int = 0, model: str | DeviceModel = "gpu",
                  contention: LinkContention = NO_CONTENTION) -> list[PairPrediction]:
    """Predicts all policies for each pair (vectorised) on device `model` (device_models:
    "gpu" or "cpu") over a link with the measured `contention`, and recommends one per
    pair."""
    for a, b in pairs:
        if a.name == b.name:
            raise ValueError(f"cannot pair job {a.name!r} with itself")
    times = PairTimes.from_profiles(pairs)
    model = device_model(model, device_efficiency)
    steps = policy_steps_per_s(times, n_offsets=n_offsets, samples=samples, seed=seed,
                               model=model, contention=contention)
    normalised_all = {p: normalised_throughput(steps[p], times) for p in PREDICTED}
    predictions = []
    for i, (a, b) in enumerate(pairs):
        images = np.array([a.images_per_step, b.images_per_step])
        normalised = {p: float(normalised_all[p][i]) for p in PREDICTED}
        choice, chosen, reason = recommended(normalised, min_gain)
        best_colocated = max(normalised[p] for p in CROSSING)
        predictions.append(PairPrediction(
            job_a=a.name, job_b=b.name, device_model=model.name, normalised=normalised,
            images_per_s={p: float(steps[p][i] @ images) for p in PREDICTED},
            steps_per_s={p: steps[p][i].tolist() for p in PREDICTED},
            shift_offset_s=float(steps["shift_offset_s"][i]),
            hyperperiod_s=hyperperiod_s(a.period_s, b.period_s),
            recommendation=choice,
            expected_gain=normalised[chosen] / normalised["sequential"],
            gain_vs_naive=best_colocated / normalised["naive"],
            reason=reason, policy=chosen))
    return predictions


def predict_pair(a: JobProfile, b: JobProfile, **kwargs: Any) -> PairPrediction:
    """Predicts all policies for jobs ``a`` and ``b`` (see ``predict_pairs``)."""
    return predict_pairs([(a, b)], **kwargs)[0]


def fifo_round_s(profiles: Sequence[JobProfile], *, cpu: bool = False) -> float:
    """The steady-state step of N jobs crossing in FIFO rounds on the same hosts: each job
    computes once per round, one at a time on each device, and its allreduce overlaps the
    others' compute. Three things bound a round, and the longest one sets it:

    * the device: every job's device phase, one after another: sum of C_i;
    * the links: the jobs share the hosts' links, so their allreduces at full bandwidth add up:
      sum of M_i;
    * one job's own step: it cannot compute again before its allreduce is done: max(C_i + M_i).

    For N equal jobs a round is N*max(C, M), so crossing gives (C+M)/max(C, M) over running
    them in turn for any N >= 2: a third identical job on the same links adds nothing, at any
    M/C. N-way crossing pays for unequal jobs (a short-M job fills a long-M job's gap) or jobs
    whose allreduces use different links. Apply and handoff time count as device time.

    ``cpu=True`` is the cpu device model: each hold also carries the CPU the others'
    allreduces take meanwhile (comm_cpu_s), and the core cannot do more than the CPU all steps
    use (cpu_demand_s).
    """
    if not profiles:
        raise ValueError("fifo_round_s needs at least one job")
    device = [p.compute_s + p.apply_s + p.handoff_s for p in profiles]
    comm = [p.comm_s for p in profiles]
    own = [c + m + p.other_s for c, m, p in zip(device, comm, profiles)]
    if not cpu:
        return max(sum(device), sum(comm), max(own))
    stolen = sum(p.comm_cpu_s for p in profiles)
    return max(sum(device) + stolen, sum(p.cpu_demand_s for p in profiles), sum(comm), max(own))


def naive_round_s(profiles: Sequence[JobProfile]) -> float:
    """One step of each of N jobs co-located on a time-sliced core without a lease (the cpu
    device model): bounded by the CPU the steps use, the shared links and each solo step."""
    return max(sum(p.cpu_demand_s for p in profiles), sum(p.comm_s for p in profiles),
               max(p.period_s for p in profiles))


def fifo_speedup_over_sequential(profiles: Sequence[JobProfile]) -> float:
    """Aggregate throughput of N crossed jobs over running them one after another."""
    sequential = sum(p.compute_s + p.apply_s + p.comm_s + p.other_s for p in profiles)
    return sequential / fifo_round_s(profiles)
