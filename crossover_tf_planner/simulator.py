"""Discrete-event simulator of jobs on many hosts: it models time, it moves no tensors.

Each host has one device and one network link (its NIC), both of capacity 1.
A job spans some hosts (one rank each) and repeats synchronous steps:

1. every rank runs its device phase (compute + apply, sampled per rank);
2. when all ranks are done, one allreduce flow crosses the links of all the
   job's hosts (its duration is the time at full bandwidth);
3. a resource-free ``other`` phase, then the next step.

Resources are shared as fluids: every active flow (a rank's device phase, a
job's allreduce) gets a max-min fair rate over the resources it uses
(progressive filling), recomputed only in the connected component a change
touches.  Policies decide who may use a device:

* ``sequential``: a job takes the FIFO leases of all its hosts (in host order,
  so no deadlock) for a whole step -> time multiplexing;
* ``naive`` / ``shift``: no lease, devices are processor-shared (``shift`` is
  naive with chosen start offsets, see ``SimJob.start_s``);
* ``crossover``: each rank takes its host's FIFO lease for its device phase
  only; a hand-off to a different job costs ``handoff_s`` of device time.

Phase times are normal draws truncated at 0 from one seeded generator.  The
result keeps lease hold intervals and per-resource peaks so tests can check
conservation (no device held by two jobs, no link above capacity).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import random
from typing import Any, Callable, Sequence

from crossover_tf_planner.policies import POLICIES
from crossover_tf_planner.profile import JobProfile

_LEASED = ("sequential", "crossover")


@dataclasses.dataclass(frozen=True)
class SimJob:
    """A job, the hosts it spans, its policy and when it starts."""

    profile: JobProfile
    hosts: tuple[int, ...]
    policy: str
    start_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.hosts or len(set(self.hosts)) != len(self.hosts):
            raise ValueError(f"job {self.profile.name!r}: hosts must be distinct and non-empty")
        if self.policy not in POLICIES:
            raise ValueError(f"job {self.profile.name!r}: policy must be one of {POLICIES}")
        if self.start_s < 0:
            raise ValueError(f"job {self.profile.name!r}: start_s must be >= 0")


@dataclasses.dataclass
class SimResult:
    """Steady-state throughput per job and the traces that prove conservation."""

    duration_s: float
    events: int
    steps: dict[str, int]
    steps_per_s: dict[str, float]
    normalised: dict[str, float]
    images_per_s: float
    lease_holds: dict[int, list[tuple[float, float, str]]]
    device_peak_flows: dict[int, int]
    link_peak_rate: dict[int, float]

    def summary(self) -> dict[str, Any]:
        """The result without the per-interval traces (small enough for JSON)."""
        return {"duration_s": self.duration_s, "events": self.events, "steps": self.steps,
                "steps_per_s": self.steps_per_s, "normalised": self.normalised,
                "images_per_s": self.images_per_s,
                "normalised_total": sum(self.normalised.values()),
                "max_device_flows": max(self.device_peak_flows.values(), default=0),
                "max_link_rate": max(self.link_peak_rate.values(), default=0.0)}


class _Flow:
    __slots__ = ("resources", "remaining", "rate", "updated", "version", "on_done")

    def __init__(self, resources: tuple[int, ...], work: float, now: float,
                 on_done: Callable[[], None]) -> None:
        self.resources, self.remaining, self.on_done = resources, work, on_done
        self.rate, self.updated, self.version = 0.0, now, 0


class _Engine:
    """Event queue plus fluid resources with max-min fair sharing."""

    def __init__(self, n_resources: int, capacity_when_shared: list[float]) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Any]] = []
        self._seq = itertools.count()
        self.flows_on: list[set[_Flow]] = [set() for _ in range(n_resources)]
        self._shared_capacity = capacity_when_shared
        self.peak_flows = [0] * n_resources
        self.peak_rate = [0.0] * n_resources

    def at(self, time: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (time, next(self._seq), action))

    def start_flow(self, resources: tuple[int, ...], work: float,
                   on_done: Callable[[], None]) -> None:
        flow = _Flow(resources, work, self.now, on_done)
        for r in resources:
            self.flows_on[r].add(flow)
            self.peak_flows[r] = max(self.peak_flows[r], len(self.flows_on[r]))
        self._reshare(resources)

    def _finish(self, flow: _Flow, version: int) -> None:
        if version != flow.version:
            return  # superseded by a rate change
        for r in flow.resources:
            self.flows_on[r].discard(flow)
        self._reshare(flow.resources)
        flow.on_done()

    def _component(self, seeds: tuple[int, ...]) -> tuple[set[int], set[_Flow]]:
        resources, flows, stack = set(seeds), set(), list(seeds)
        while stack:  # bounded: each resource enters the stack once
            for flow in self.flows_on[stack.pop()]:
                if flow not in flows:
                    flows.add(flow)
                    fresh = [r for r in flow.resources if r not in resources]
                    resources.update(fresh)
                    stack.extend(fresh)
        return resources, flows

    def _reshare(self, seeds: tuple[int, ...]) -> None:
        resources, flows = self._component(seeds)
        for flow in flows:
            flow.remaining = max(0.0, flow.remaining - flow.rate * (self.now - flow.updated))
            flow.updated = self.now
        capacity = {r: (1.0 if len(self.flows_on[r]) <= 1 else self._shared_capacity[r])
                    for r in resources}
        count = {r: len(self.flows_on[r]) for r in resources}
        unfrozen = set(flows)
        for _ in range(len(flows)):  # progressive filling: one bottleneck per round
            if not unfrozen:
                break
            bottleneck = min((r for r in resources if count[r] > 0),
                             key=lambda r: capacity[r] / count[r])
            share = capacity[bottleneck] / count[bottleneck]
            for flow in self.flows_on[bottleneck] & unfrozen:
                flow.rate = share
                unfrozen.discard(flow)
                for r in flow.resources:
                    capacity[r] -= share
                    count[r] -= 1
        for r in resources:
            load = sum(flow.rate for flow in self.flows_on[r])
            self.peak_rate[r] = max(self.peak_rate[r], load)
        for flow in flows:
            flow.version += 1
            finish = self.now + (flow.remaining / flow.rate if flow.rate > 0 else 0.0)
            version = flow.version
            self.at(finish, lambda f=flow, v=version: self._finish(f, v))

    def run(self, done: Callable[[], bool], max_events: int) -> int:
        for event in range(max_events):
            if not self._heap or done():
                return event
            self.now, _, action = heapq.heappop(self._heap)
            action()
        raise RuntimeError(f"simulation did not finish within {max_events} events")


class _Lease:
    """FIFO device lease: one holder at a time, waiters served in arrival order."""

    def __init__(self, engine: _Engine) -> None:
        self._engine = engine
        self.holder: str | None = None
        self._last: str | None = None
        self._since = 0.0
        self._queue: collections.deque = collections.deque()
        self.holds: list[tuple[float, float, str]] = []

    def acquire(self, job: str, granted: Callable[[bool], None]) -> None:
        if self.holder is None:
            self._grant(job, granted)
        else:
            self._queue.append((job, granted))

    def _grant(self, job: str, granted: Callable[[bool], None]) -> None:
        handoff = self._last is not None and self._last != job
        self.holder, self._since = job, self._engine.now
        granted(handoff)

    def yield_device(self) -> None:
        self.holds.append((self._since, self._engine.now, self.holder))
        self._last, self.holder = self.holder, None
        if self._queue:
            self._grant(*self._queue.popleft())


class _JobRun:
    """State machine of one job's synchronous steps under its policy."""

    def __init__(self, job: SimJob, engine: _Engine, leases: dict[int, _Lease],
                 n_hosts: int, rng: random.Random) -> None:
        self.job, self.engine, self.leases, self.rng = job, engine, leases, rng
        self.links = tuple(n_hosts + h for h in job.hosts)
        self.completions: list[float] = []
        self._pending = 0

    def _draw(self, mean: float, std: float) -> float:
        return max(0.0, self.rng.gauss(mean, std)) if std > 0 else mean

    def begin_step(self) -> None:
        self._pending = len(self.job.hosts)
        if self.job.policy == "sequential":
            self._gang_acquire(0)
        else:
            for host in self.job.hosts:
                if self.job.policy == "crossover":
                    self.leases[host].acquire(self.job.profile.name,
                                              lambda handoff, h=host: self._compute(h, handoff))
                else:
                    self._compute(host, False)

    def _gang_acquire(self, index: int) -> None:
        hosts = sorted(self.job.hosts)
        if index == len(hosts):
            for host in hosts:
                self._compute(host, False)
            return
        self.leases[hosts[index]].acquire(self.job.profile.name,
                                          lambda _handoff: self._gang_acquire(index + 1))

    def _compute(self, host: int, handoff: bool) -> None:
        p = self.job.profile
        work = self._draw(p.device_s, p.compute_std_s) + (p.handoff_s if handoff else 0.0)
        self.engine.start_flow((host,), work, lambda: self._computed(host))

    def _computed(self, host: int) -> None:
        if self.job.policy == "crossover":
            self.leases[host].yield_device()
        self._pending -= 1
        if self._pending == 0:
            p = self.job.profile
            self.engine.start_flow(self.links, self._draw(p.comm_s, p.comm_std_s),
                                   self._communicated)

    def _communicated(self) -> None:
        self.completions.append(self.engine.now)
        self.engine.at(self.engine.now + self.job.profile.other_s, self._step_done)

    def _step_done(self) -> None:
        if self.job.policy == "sequential":
            for host in sorted(self.job.hosts):
                self.leases[host].yield_device()
        self.begin_step()


def _check_jobs(jobs: Sequence[SimJob], n_hosts: int) -> None:
    if not jobs:
        raise ValueError("cannot simulate an empty job list")
    names = [job.profile.name for job in jobs]
    if len(set(names)) != len(names):
        raise ValueError(f"job names must be unique, got {names}")
    policy_of_host: dict[int, str] = {}
    for job in jobs:
        for host in job.hosts:
            if not 0 <= host < n_hosts:
                raise ValueError(f"job {job.profile.name!r} uses host {host}, "
                                 f"outside 0..{n_hosts - 1}")
            kind = "leased" if job.policy in _LEASED else "free"
            if policy_of_host.setdefault(host, job.policy) != job.policy and (
                    kind == "leased" or policy_of_host[host] in _LEASED):
                raise ValueError(f"host {host} mixes policies {policy_of_host[host]!r} "
                                 f"and {job.policy!r}")


def simulate(jobs: Sequence[SimJob], n_hosts: int, *, steps: int = 60,
             warmup_steps: int = 10, seed: int = 0, device_efficiency: float = 1.0,
             max_events: int = 2_000_000) -> SimResult:
    """Runs until every job has finished ``steps`` steps; throughput is measured
    from each job's ``warmup_steps``-th completion to its last one."""
    if n_hosts < 1:
        raise ValueError("n_hosts must be >= 1")
    if not 1 <= warmup_steps < steps:
        raise ValueError("need 1 <= warmup_steps < steps")
    _check_jobs(jobs, n_hosts)
    engine = _Engine(2 * n_hosts, [device_efficiency] * n_hosts + [1.0] * n_hosts)
    leases = {h: _Lease(engine) for h in range(n_hosts)}
    rng = random.Random(seed)
    runs = [_JobRun(job, engine, leases, n_hosts, rng) for job in jobs]
    for run in runs:
        engine.at(run.job.start_s, run.begin_step)
    events = engine.run(lambda: all(len(r.completions) >= steps for r in runs), max_events)
    steps_per_s = {}
    for run in runs:
        t = run.completions
        steps_per_s[run.job.profile.name] = (len(t) - warmup_steps) / (t[-1] - t[warmup_steps - 1])
    normalised = {run.job.profile.name: steps_per_s[run.job.profile.name]
                  * run.job.profile.period_s for run in runs}
    return SimResult(
        duration_s=engine.now, events=events,
        steps={r.job.profile.name: len(r.completions) for r in runs},
        steps_per_s=steps_per_s, normalised=normalised,
        images_per_s=sum(steps_per_s[r.job.profile.name] * r.job.profile.images_per_step
                         for r in runs),
        lease_holds={h: lease.holds for h, lease in leases.items() if lease.holds},
        device_peak_flows={h: engine.peak_flows[h] for h in range(n_hosts)},
        link_peak_rate={h: engine.peak_rate[n_hosts + h] for h in range(n_hosts)})
