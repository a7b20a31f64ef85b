"""Where the shared core goes while a job computes: every thread on the core, per compute
hold, on the emulated cluster (issue 52, item 1).

Why: with link turns a job's compute hold runs 13-23% longer beside the other job's allreduce
than alone, and the comm-CPU probe accounts for little of it. This probe runs job A alone, then
A and B crossed with link turns (launch_pair, the main job's model and flags), under the
kernel's scheduler tracepoints (`perf record -e sched:sched_switch -e irq:softirq_*`, every
CPU): each context switch says which thread had the core until then, each softirq how long the
kernel's network and timers took. Each compute hold of a rank (its lease events in the job's
stats) is split, on its host's core, between the job's own threads, the peer job's threads by
kind (Horovod's or TensorFlow's communication threads, TensorFlow's pools, the Python thread),
softirqs by kind (NET_RX for the shaped veth link), other processes and idle time. Sampling
/proc instead would charge its own polling to the jobs.

  sudo .venv/bin/python -m experiments.probes.thread_cpu --bandwidth_mbit=15 [--backend=...]

Prints one table per run and writes runs/thread_cpu/thread_cpu.{json,md}.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np

from crossover_tf.lease.device_lease import TAG_COMPUTE
from crossover_tf_planner.job_stats import JobStats

DISCOVERY_S = 0.25
RUN_TIMEOUT_S = 900.0
PERF_EVENTS = ("sched:sched_switch", "irq:softirq_entry", "irq:softirq_exit")
TRAIN = "experiments.train"
# perf script's lines: "comm pid/tid [cpu] seconds: event: fields".
_LINE = re.compile(r"^\s*(?P<comm>.+?)\s+(?P<pid>-?\d+)/(?P<tid>-?\d+)\s+\[(?P<cpu>\d+)\]\s+"
                   r"(?P<t>\d+\.\d+):\s+(?P<event>[\w:]+):\s*(?P<rest>.*)$")
_SWITCH = re.compile(r"prev_pid=(?P<prev>\d+).*==> next_comm=(?P<next_comm>.+?) "
                     r"next_pid=(?P<next>\d+)")
_SOFTIRQ = re.compile(r"action=(?P<action>\w+)")


def thread_group(name: str) -> str:
    """A thread's kind: its name without the numbers that tell pool members apart."""
    return re.sub(r"[\d_/:-]+$", "", name) or name


def find_ranks(marker: str) -> dict[tuple[str, int], int]:
    """(job, cpu) -> pid of every train.py rank whose command line holds marker (the run's
    own model_dir); the cpu is the one its emulated host pins it to."""
    ranks = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
            cpus = os.sched_getaffinity(int(entry))
        except OSError:
            continue
        if TRAIN not in argv or not any(marker in a for a in argv) or len(cpus) != 1:
            continue
        job = next((a.split("=", 1)[1] for a in argv if a.startswith("--job=")), None)
        if job is not None:
            ranks[(job, next(iter(cpus)))] = int(entry)
    return ranks


class RankFinder:
    """Finds the run's ranks in a background thread (cheaply: every DISCOVERY_S, until all
    are there), so that their pids are known after they exit."""

    def __init__(self, marker: str, expected: int):
        self.marker, self.expected = marker, expected
        self.ranks: dict[tuple[str, int], int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "RankFinder":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while len(self.ranks) < self.expected and not self._stop.wait(DISCOVERY_S):
            self.ranks.update(find_ranks(self.marker))


class Slice(NamedTuple):
    """Time one core spent on one thing: a thread (kind "thread") between context switches,
    or a softirq (kind "softirq", name its action) that interrupted the thread `under`."""
    start: float
    end: float
    kind: str
    tgid: int           # the thread's process (0: idle; -1: unknown)
    name: str
    tid: int = -1
    under: tuple[int, str, int] = (-1, "", -1)  # a softirq's interrupted (tgid, name, tid)


def parse_perf(lines: Iterable[str]) -> dict[int, list[Slice]]:
    """cpu -> Slices, in CLOCK_MONOTONIC seconds, from `perf script -F
    comm,pid,tid,cpu,time,event,trace` of sched_switch and softirq entry/exit."""
    tgid_of: dict[int, int] = {0: 0}
    current: dict[int, tuple[float, int, str]] = {}    # cpu -> (since, tid, name)
    softirq: dict[int, tuple[float, str]] = {}
    raw: dict[int, list[tuple[float, float, str, int, str, int, str]]] = (
        collections.defaultdict(list))
    for line in lines:
        m = _LINE.match(line)
        if not m:
            continue
        cpu, t, event = int(m["cpu"]), float(m["t"]), m["event"]
        tgid_of[int(m["tid"])] = int(m["pid"])
        if event == "sched:sched_switch":
            s = _SWITCH.search(m["rest"])
            if not s:
                continue
            if cpu in current:
                since, tid, name = current[cpu]
                raw[cpu].append((since, t, "thread", tid, name, -1, ""))
            current[cpu] = (t, int(s["next"]), s["next_comm"])
        elif event == "irq:softirq_entry":
            a = _SOFTIRQ.search(m["rest"])
            softirq[cpu] = (t, a["action"] if a else "?")
        elif event == "irq:softirq_exit" and cpu in softirq:
            since, action = softirq.pop(cpu)
            _, tid, name = current.get(cpu, (0.0, -1, "?"))
            raw[cpu].append((since, t, "softirq", -1, action, tid, name))
    return {cpu: [Slice(a, b, kind, tgid_of.get(tid, -1) if kind == "thread" else -1, name,
                        tid, (tgid_of.get(u_tid, -1), u_name, u_tid))
                  for a, b, kind, tid, name, u_tid, u_name in items]
            for cpu, items in raw.items()}


def owner_key(tgid: int, name: str, tid: int, owners: dict[int, str]) -> str:
    """"own/<kind>", "peer B/<kind>", "other/<kind>" or "idle" for a thread on the core; the
    peer's threads one by one ("peer B/<kind> #<tid - pid>": #0 is its main thread, and
    threads made early have small numbers), since they are what the investigation is after."""
    if tgid == 0:
        return "idle"
    owner = owners.get(tgid, "other")
    if owner.startswith("peer"):
        return f"{owner}/{thread_group(name)} #{tid - tgid}"
    return f"{owner}/{thread_group(name)}"


def split_interval(slices: list[Slice], start: float, end: float,
                   owners: dict[int, str]) -> dict[str, float]:
    """Seconds of [start, end] on one core by owner and kind (owner_key; owners names the
    ranks' pids) and softirqs by action; a softirq's time is taken out of the thread it
    interrupted, so the parts add up to the interval."""
    shares: dict[str, float] = collections.defaultdict(float)
    for piece in slices:
        overlap = min(piece.end, end) - max(piece.start, start)
        if overlap <= 0:
            continue
        if piece.kind == "softirq":
            shares[f"softirq/{piece.name}"] += overlap
            shares[owner_key(*piece.under, owners)] -= overlap
        else:
            shares[owner_key(piece.tgid, piece.name, piece.tid, owners)] += overlap
    return shares


def compute_holds(stats: JobStats, warmup_steps: int) -> np.ndarray:
    """[acquired, released] wall-clock ns of the job's timed compute holds."""
    events = np.asarray(stats.lease_events_ns, dtype=np.int64).reshape(-1, 4)
    events = events[events[:, 3] == TAG_COMPUTE]
    return events[warmup_steps:, 1:3]


def breakdown(slices: dict[int, list[Slice]],
              ranks: dict[tuple[str, int], int], stats: dict[tuple[str, int], JobStats],
              warmup_steps: int, wall_minus_mono_ns: int) -> dict[str, Any]:
    """Per rank: its compute holds' mean length and the ms per hold of everything on its core
    (its own threads, the peer's by kind, softirqs, other processes, idle)."""
    out = {}
    for (job, cpu), job_stats in stats.items():
        holds = compute_holds(job_stats, warmup_steps)
        if len(holds) == 0 or cpu not in slices:
            continue
        owners = {pid: ("own" if j == job else f"peer {j}") for (j, c), pid in ranks.items()
                  if c == cpu}
        total: dict[str, float] = collections.defaultdict(float)
        for a, b in (holds - wall_minus_mono_ns) / 1e9:
            for key, seconds in split_interval(slices[cpu], a, b, owners).items():
                total[key] += seconds
        out[f"{job}@cpu{cpu}"] = {
            "holds": len(holds), "hold_ms": float(np.mean(holds[:, 1] - holds[:, 0])) / 1e6,
            "ms_per_hold": {k: 1e3 * v / len(holds)
                            for k, v in sorted(total.items(), key=lambda kv: -kv[1])}}
    return out


def launch(args: argparse.Namespace, mode: str, out: pathlib.Path) -> dict[str, Any]:
    """One launch_pair run (mode single: job A alone; concurrent: A and B crossed with link
    turns) under perf; returns its breakdown."""
    run_dir = out / f"{mode}-{uuid.uuid4().hex[:6]}"
    run_dir.mkdir(parents=True)
    group = f"tc{uuid.uuid4().hex[:8]}"
    jobs = ("A",) if mode == "single" else ("A", "B")

    def train(job: str, turn: int) -> str:
        flags = {"job": job, "group": group, "group_jobs": len(jobs), "model": args.model,
                 "dataset": args.dataset, "global_batch_size": args.global_batch_size,
                 "steps": args.steps, "warmup_steps": args.warmup_steps,
                 "model_dir": str(run_dir), "link_turn": turn if len(jobs) > 1 else -1,
                 "backend": args.backend}
        return shlex.join(["python", "-m", TRAIN, *(f"--{k}={v}" for k, v in flags.items())])

    command = [sys.executable, "-m", "experiments.launch_pair", f"--num_hosts={args.num_hosts}",
               f"--mode={mode}", f"--job_a={train('A', 0)}", f"--job_b={train('B', 1)}",
               f"--log_dir={run_dir / 'logs'}", f"--lease_groups={group}",
               f"--backend={args.backend}", f"--timeout_s={RUN_TIMEOUT_S}"]
    if args.bandwidth_mbit:
        command.append(f"--bandwidth_mbit={args.bandwidth_mbit}")
    perf_data = run_dir / "perf.data"
    perf = subprocess.Popen(["perf", "record", "-q", "-a", "-k", "mono", "-o", str(perf_data),
                             *(x for e in PERF_EVENTS for x in ("-e", e))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall_minus_mono_ns = time.time_ns() - time.monotonic_ns()
    try:
        with RankFinder(str(run_dir), expected=len(jobs) * args.num_hosts) as finder:
            done = subprocess.run(command, capture_output=True, text=True,
                                  timeout=RUN_TIMEOUT_S + 60)
    finally:
        perf.send_signal(signal.SIGINT)
        perf.wait(timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"launch_pair failed ({done.returncode}):\n{done.stderr[-4000:]}")
    stats = {}
    for job in jobs:
        for rank in range(args.num_hosts):
            name = "stats.json" if rank == 0 else f"stats.rank{rank}.json"
            stats[(job, rank % os.cpu_count())] = JobStats.from_json(run_dir / job / name)
    script = subprocess.Popen(["perf", "script", "-i", str(perf_data), "-F",
                               "comm,pid,tid,cpu,time,event,trace"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    slices = parse_perf(script.stdout)
    script.wait(timeout=600)
    perf_data.unlink()
    return {"mode": mode, "run_dir": str(run_dir), "backend": args.backend,
            "step_time_s": {f"{j}@cpu{c}": s.step_time_s for (j, c), s in stats.items()},
            "ranks": {f"{j}@cpu{c}": pid for (j, c), pid in finder.ranks.items()},
            "holds": breakdown(slices, finder.ranks, stats, args.warmup_steps,
                               wall_minus_mono_ns)}


def markdown(results: Sequence[dict[str, Any]]) -> str:
    """One table per run: each rank's compute hold and what had its core meanwhile."""
    lines = []
    for result in results:
        lines += [f"### {result['mode']}, {result['backend']} ({result['run_dir']})", "",
                  "| rank | hold ms | on the core meanwhile | ms per hold |", "|---|---|---|---|"]
        for key, hold in result["holds"].items():
            for what, ms in hold["ms_per_hold"].items():
                if abs(ms) >= 0.5:
                    lines.append(f"| {key} | {hold['hold_ms']:.1f} | {what} | {ms:.1f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bandwidth_mbit", type=float, default=15.0)
    parser.add_argument("--num_hosts", type=int, default=2)
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--dataset", default="synthetic:cifar10")
    parser.add_argument("--global_batch_size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup_steps", type=int, default=5)
    parser.add_argument("--backend", choices=["horovod", "tensorflow"], default="horovod")
    parser.add_argument("--modes", default="single,concurrent")
    parser.add_argument("--out", default="runs/thread_cpu")
    args = parser.parse_args(argv)
    if args.warmup_steps >= args.steps:
        parser.error(f"--warmup_steps ({args.warmup_steps}) must be below --steps "
                     f"({args.steps})")
    if shutil.which("perf") is None or os.geteuid() != 0:
        parser.error("needs root (network namespaces, every CPU's tracepoints) and perf "
                     "(Debian: apt-get install linux-perf)")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = [launch(args, mode, out) for mode in args.modes.split(",")]
    (out / "thread_cpu.json").write_text(json.dumps(results, indent=1))
    text = markdown(results)
    (out / "thread_cpu.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
