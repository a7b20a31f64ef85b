"""Fluid model of two jobs on one device and one link, vectorised over many cases.

Both jobs repeat their step cycle (device -> link -> other).  The link is shared
by processor sharing (equal bandwidth when both communicate, ``link_efficiency``
of the link between them: allreduces that overlap at random move less than one
alone, comm_cost.LinkContention).  The device is
either

* free (naive co-location and shift): processor-shared, each job gets
  ``device_efficiency / 2`` of it while both compute; or
* leased (crossover): one holder at a time, the other waits (FIFO, so a waiter
  beats a job that comes back at the same instant); a hand-off to the other
  job adds its ``handoff_s`` of device work.

Job 1 starts ``offset_s`` after job 0.  Deterministic fluid dynamics preserve or
lock the relative phase, so the steady state depends on the offset: a shift
scheduler picks it, naive co-location leaves it to chance.  Evaluating many
offsets and pairs at once in numpy keeps the sweep at seconds.
"""

from __future__ import annotations

import numpy as np

DEVICE, LINK, OTHER = 0, 1, 2
_N_PHASES = 3
_NOBODY = -1


def colocated_steps_per_s(work: np.ndarray, offset_s: np.ndarray, *,
                          leased: bool = False, handoff_s: np.ndarray | None = None,
                          device_efficiency: float = 1.0, n_events: int = 1200,
                          warmup_fraction: float = 0.3, link_efficiency: float = 1.0
                          ) -> np.ndarray:
    """Steady-state steps/s of two co-located jobs, for ``n`` independent cases.

    ``work`` has shape ``(n, 2, 3)``: per case, per job, the seconds of device,
    link and other phase at full speed (device work must be > 0); ``handoff_s``
    has shape ``(n, 2)`` and only matters when ``leased``.  Returns ``(n, 2)``,
    measured between step completions after the first ``warmup_fraction`` of
    the phase completions: ``n_events`` of them for jobs of similar steps, more (up to
    ``MAX_EVENT_SCALE`` times) when one job's step is many times the other's, since the slow
    job must complete steps too while the fast one completes a phase per event.
    """
    work, offset_s, handoff = _checked_inputs(work, offset_s, handoff_s, device_efficiency)
    n_events = n_events * _event_scale(work, n_events, warmup_fraction)
    n = work.shape[0]
    jobs = np.arange(2)[None, :]
    # Job 1 waits out its offset in a resource-free OTHER phase before its first step.
    phase = np.array([[DEVICE, OTHER]] * n)
    remaining = np.stack([work[:, 0, DEVICE], offset_s], axis=1)
    holder = np.zeros(n, dtype=int) if leased else np.full(n, _NOBODY)
    last = np.full(n, _NOBODY)
    now = np.zeros(n)
    clock = _StepClock(n)
    warmup = int(n_events * warmup_fraction)
    for event in range(n_events):
        on_device = phase == DEVICE
        rate = _rates(phase, holder if leased else None, device_efficiency, link_efficiency)
        with np.errstate(divide="ignore"):
            time_left = np.where(rate > 0, remaining / np.maximum(rate, 1e-300), np.inf)
        dt = time_left.min(axis=1)
        now += dt
        done = time_left <= dt[:, None] * (1 + 1e-9) + 1e-15
        remaining = np.where(done, 0.0, remaining - rate * dt[:, None])
        waiting_before = on_device & ~done & (holder[:, None] != jobs)
        if leased:
            released = (done & on_device).any(axis=1)
            last = np.where(released, holder, last)
            holder = np.where(released, _NOBODY, holder)
        phase, remaining = _advance(phase, remaining, done, work, clock,
                                    now if event >= warmup else None)
        if leased:
            holder, remaining = _grant(phase, holder, last, waiting_before, remaining, handoff)
    return clock.steps_per_s()


MAX_EVENT_SCALE = 50  # events grow with the jobs' step ratio up to this factor (bounds run time)
# Phase completions per step of the faster job (device, link, other), and the slower job's
# steps the window needs after warm-up to measure a rate between step completions.
_EVENTS_PER_STEP, _SLOW_STEPS = 3, 4


class StepRatioOutOfRange(ValueError):
    """One job's step is so many times the other's that the model cannot see both step."""


def _event_scale(work: np.ndarray, n_events: int, warmup_fraction: float) -> int:
    """How many times n_events the slower job needs to complete steps in the window; a
    StepRatioOutOfRange, before any simulating, when that is beyond MAX_EVENT_SCALE."""
    period = work.sum(axis=2)
    ratio = float((period.max(axis=1) / period.min(axis=1)).max())
    events_per_ratio = _EVENTS_PER_STEP * _SLOW_STEPS / (1.0 - warmup_fraction)
    scale = max(1, int(np.ceil(events_per_ratio * ratio / n_events)))
    if scale > MAX_EVENT_SCALE:
        followed = MAX_EVENT_SCALE * n_events / events_per_ratio
        raise StepRatioOutOfRange(
            f"one job's step is {ratio:.0f} times the other's, beyond what the planner's "
            f"fluid model can follow (about {followed:.0f} times). Jobs so "
            "unlike gain little from taking turns on a device; check that both profiles "
            "describe the jobs you mean (the same units, whole steps)")
    return scale


def _checked_inputs(work: np.ndarray, offset_s: np.ndarray, handoff_s: np.ndarray | None,
                    device_efficiency: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The inputs as float arrays of the documented shapes, or a ValueError saying what is off."""
    work = np.asarray(work, dtype=float)
    offset_s = np.asarray(offset_s, dtype=float)
    if work.ndim != 3 or work.shape[1:] != (2, _N_PHASES):
        raise ValueError(f"work must have shape (n, 2, 3), got {work.shape}")
    n = work.shape[0]
    handoff = np.zeros((n, 2)) if handoff_s is None else np.asarray(handoff_s, float)
    if offset_s.shape != (n,) or handoff.shape != (n, 2):
        raise ValueError("offset_s must have shape (n,) and handoff_s (n, 2)")
    if (np.any(work < 0) or np.any(work[:, :, DEVICE] <= 0) or np.any(offset_s < 0)
            or np.any(handoff < 0)):
        raise ValueError("phase work, offsets and hand-offs must be >= 0, device work > 0")
    if not 0 < device_efficiency <= 1:
        raise ValueError("device_efficiency must be in (0, 1]")
    return work, offset_s, handoff


def _rates(phase: np.ndarray, holder: np.ndarray | None, device_efficiency: float,
           link_efficiency: float = 1.0) -> np.ndarray:
    """Speed of each job's current phase: the link is shared equally (``link_efficiency``
    of it between the two); the device goes to the lease holder only (``holder`` given) or
    is processor-shared."""
    on_device = phase == DEVICE
    rate = np.where(phase == LINK, np.where((phase == LINK).all(1, keepdims=True),
                                            link_efficiency / 2, 1.0), 1.0)
    if holder is not None:
        return np.where(on_device, (holder[:, None] == np.arange(2)[None, :]).astype(float),
                        rate)
    return np.where(on_device & on_device.all(1, keepdims=True), device_efficiency / 2, rate)


def _advance(phase: np.ndarray, remaining: np.ndarray, done: np.ndarray, work: np.ndarray,
             clock: "_StepClock", now: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Moves finished jobs to their next phase, skipping phases with no work (the device
    phase always has work, so two skips at most); counts steps, timed when ``now`` is given."""
    cases = np.arange(phase.shape[0])[:, None]
    jobs = np.arange(2)[None, :]
    for _ in range(_N_PHASES):
        phase = np.where(done, (phase + 1) % _N_PHASES, phase)
        entered_step = done & (phase == DEVICE)
        clock.count(entered_step, now)
        remaining = np.where(done, work[cases, jobs, phase], remaining)
        done = done & (remaining <= 0)
        if not done.any():
            break
    return phase, remaining


class _StepClock:
    """Counts each job's steps and remembers when the timed window's first and last began."""

    def __init__(self, n: int):
        self.steps = np.zeros((n, 2))
        self.first_t = np.full((n, 2), np.nan)
        self.first_steps = np.zeros((n, 2))
        self.last_t = np.full((n, 2), np.nan)
        self.last_steps = np.zeros((n, 2))

    def count(self, entered_step: np.ndarray, now: np.ndarray | None) -> None:
        self.steps += entered_step
        if now is None:
            return
        record = entered_step & np.isnan(self.first_t)
        self.first_t = np.where(record, now[:, None], self.first_t)
        self.first_steps = np.where(record, self.steps, self.first_steps)
        self.last_t = np.where(entered_step, now[:, None], self.last_t)
        self.last_steps = np.where(entered_step, self.steps, self.last_steps)

    def steps_per_s(self) -> np.ndarray:
        span = self.last_t - self.first_t
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = (self.last_steps - self.first_steps) / span
        if np.any(~np.isfinite(rate)) or np.any(rate <= 0):
            raise RuntimeError("fluid model saw too few steps per job (fluid._event_scale "
                               "should have made the window long enough)")
        return rate


def _grant(phase: np.ndarray, holder: np.ndarray, last: np.ndarray,
           waiting_before: np.ndarray, remaining: np.ndarray, handoff: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """Gives a free device to a job on it: earlier waiters first, then job 0."""
    order = np.where(waiting_before[:, 1], 1, 0)
    for position in range(2):
        job = order if position == 0 else 1 - order
        wants = (phase[np.arange(len(job)), job] == DEVICE) & (holder == _NOBODY)
        pays = wants & (last != _NOBODY) & (last != job)
        holder = np.where(wants, job, holder)
        remaining = remaining.copy()
        remaining[np.arange(len(job)), job] += np.where(pays, handoff[np.arange(len(job)), job], 0)
    return holder, remaining
