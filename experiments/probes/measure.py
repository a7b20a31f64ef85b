"""The planner's inputs measured on the emulated cluster (root), one probe per ``--mode``:

* ``calibrate``: about a minute measuring what an allreduce costs the CPU core it shares with
  another job's compute (comm_cpu.measure);
* ``link_sharing``: about two minutes: two jobs' allreduces at once against one job's alone,
  i.e. whether the link shares evenly (comm_cpu.measure_sharing);
* ``contention``: about a minute and a half: the link's efficiency when two jobs' allreduces
  overlap at random, and an allreduce's slowdown beside a busy core (the planner's
  LinkContention, comm_cpu.measure_contention).

  python -m experiments.probes --mode=calibrate --calibrate_mbit=20

Everything lands in ``--out_dir`` as ``<mode>.json`` and ``<mode>.md``; plan.py and replan.py
take them (--comm_cpu, --link_contention).
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from absl import flags

from experiments import config as config_lib

MODES = ("calibrate", "link_sharing", "contention")


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    define = config_lib.flag_definer(flag_values)
    define(flags.DEFINE_enum, "mode", "calibrate", "What to measure.", enum_values=list(MODES))
    define(flags.DEFINE_string, "out_dir", "runs/plan", "Where results are written.")
    define(flags.DEFINE_float, "calibrate_mbit", 20.0, "Link bandwidth (Mbit/s).")
    define(flags.DEFINE_float, "calibrate_mb", 4.0, "MB per allreduce.")
    define(flags.DEFINE_float, "calibrate_seconds", 10.0,
           "Timed allreduces of one job alone (s).")
    define(flags.DEFINE_float, "calibrate_cycle_time_ms", None,
           "calibrate: HOROVOD_CYCLE_TIME for the probe (default: the emulated cluster's, "
           "netns.DEFAULT_CYCLE_TIME_MS, unless the environment sets it).")


FLAG_NAMES = config_lib.defined_names(define_flags)


def _calibrate(s: Mapping[str, Any]) -> tuple[dict, str]:
    from experiments.probes import comm_cpu
    measured = comm_cpu.measure(s["calibrate_mbit"], megabytes=s["calibrate_mb"],
                                seconds=s["calibrate_seconds"],
                                log_dir=os.path.join(s["out_dir"], "comm_cpu_logs"),
                                cycle_time_ms=s["calibrate_cycle_time_ms"])
    probe = measured.probe
    text = (f"An allreduce costs its core {measured.cpu_per_wait_s:.3f} CPU s per s of waiting "
            f"and {1e3 * measured.cpu_s_per_mb:.2f} CPU ms per MB moved ({probe['allreduces']} "
            f"allreduces of {probe['megabytes']:.2f} MB at {s['calibrate_mbit']:g} Mbit/s: "
            f"{1e3 * probe['wall_s_per_allreduce']:.1f} ms and "
            f"{1e3 * probe['cpu_s_per_allreduce']:.1f} CPU ms each, and "
            f"{1e3 * probe.get('softirq_s_per_allreduce', 0.0):.1f} ms of the kernel's softirq "
            f"on the rank's core).")
    return measured.to_dict(), text


def _link_sharing(s: Mapping[str, Any]) -> tuple[dict, str]:
    from experiments.probes import comm_cpu
    measured = comm_cpu.measure_sharing(
        s["calibrate_mbit"], megabytes=s["calibrate_mb"], seconds=s["calibrate_seconds"],
        log_dir=os.path.join(s["out_dir"], "link_sharing_logs"))
    shared = ", ".join(f"{1e3 * v:.1f}" for v in measured["shared_s_per_allreduce"].values())
    text = (f"Allreduces of {measured['megabytes']:.2f} MB at {s['calibrate_mbit']:g} Mbit/s: "
            f"{1e3 * measured['solo_s_per_allreduce']:.1f} ms each for one job alone, {shared} "
            f"ms for two jobs at once ({measured['overlap_s']:.1f} s together). Combined "
            f"throughput over one job's alone: {measured['combined_throughput']:.2f} (1: the "
            f"link splits evenly).")
    return measured, text


def _measure_contention(s: Mapping[str, Any]) -> tuple[dict, str]:
    from experiments.probes import comm_cpu
    measured = comm_cpu.measure_contention(
        s["calibrate_mbit"], megabytes=s["calibrate_mb"], seconds=s["calibrate_seconds"],
        log_dir=os.path.join(s["out_dir"], "contention_logs"))
    return measured.to_dict(), _contention_text(measured.to_dict())


def _contention_text(measured: Mapping[str, Any]) -> str:
    """One sentence on a measured LinkContention record (contention.md)."""
    probe = measured["probe"]
    return (f"Link contention at {measured['bandwidth_mbit']:.4g} Mbit/s, allreduces of "
            f"{probe['megabytes']:.2f} MB: two jobs overlapping at random moved "
            f"{measured['shared_efficiency']:.3f}x what the link moves for one "
            f"({sum(probe['allreduces'].values())} allreduces in {probe['window_s']:.0f} s); "
            f"beside a busy core an allreduce took {1e3 * probe['burdened_s']:.0f} ms against "
            f"{1e3 * probe['solo_s']:.0f} ms ({measured['compute_slowdown']:.3f}x).")


_HANDLERS = {"calibrate": _calibrate, "link_sharing": _link_sharing,
             "contention": _measure_contention}


def _check(c: Any) -> None:
    config_lib.require(c.mode in MODES, f"mode must be one of {MODES}, got {c.mode!r}")


def run(flag_values: Any = None, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Runs one probe; ``overrides`` replace flag values (for tests and callers)."""
    flag_values = flag_values if flag_values is not None else flags.FLAGS
    define_flags(flag_values)
    s = vars(config_lib.resolve(flag_values, FLAG_NAMES, overrides, _check, "probes"))
    return config_lib.run_mode(s, _HANDLERS)


def main(argv: list[str]) -> None:
    """Prints the probe's markdown."""
    if len(argv) > 1:
        raise ValueError(f"unexpected positional arguments: {argv[1:]}")
    print(run(flags.FLAGS)["markdown"])
