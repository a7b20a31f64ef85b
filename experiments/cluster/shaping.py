"""Link emulation with `tc`: a token bucket for bandwidth, netem for latency when the kernel has it.

Applied on the egress of both ends of each host's veth, so both directions of a host's link are
limited (a real NIC limits what it sends and what it receives).
"""
from __future__ import annotations

import dataclasses

from absl import logging

from experiments.cluster import shell

# The bucket must hold at least one full GSO aggregate, or tbf drops it; 10 ms of traffic keeps the
# measured rate close to the configured one for transfers of a few MB.
_MIN_BURST_BYTES = 64 * 1024
_BURST_SECONDS = 0.01
_QUEUE_LATENCY_MS = 100


@dataclasses.dataclass(frozen=True)
class LinkSpec:
    """What one emulated link should look like; None/0 means unlimited/no added delay."""
    bandwidth_mbit: float | None = None
    latency_ms: float = 0.0


def tbf_args(bandwidth_mbit: float) -> list[str]:
    """tc arguments for a token bucket of `bandwidth_mbit` megabits per second."""
    if bandwidth_mbit <= 0:
        raise ValueError(f"bandwidth_mbit must be > 0, got {bandwidth_mbit}")
    rate_bytes = bandwidth_mbit * 1e6 / 8
    burst = max(_MIN_BURST_BYTES, int(rate_bytes * _BURST_SECONDS))
    return ["tbf", "rate", f"{bandwidth_mbit}mbit", "burst", str(burst),
            "latency", f"{_QUEUE_LATENCY_MS}ms"]


def apply(dev: str, spec: LinkSpec, netns: str | None = None) -> bool:
    """Shapes the egress of `dev` (inside `netns` if given).

    Returns whether the latency part was applied: kernels without sch_netem cannot add delay, and
    the caller reports that loudly instead of pretending.
    """
    tc = ["tc"] if netns is None else ["ip", "netns", "exec", netns, "tc"]
    latency_applied = spec.latency_ms <= 0
    tbf_parent = ["root", "handle", "1:"]
    if spec.latency_ms > 0:
        added = shell.run(tc + ["qdisc", "add", "dev", dev, "root", "handle", "1:", "netem",
                                "delay", f"{spec.latency_ms}ms"], check=False)
        latency_applied = added.returncode == 0
        if latency_applied:
            tbf_parent = ["parent", "1:1", "handle", "10:"]
        else:
            logging.info("netem unavailable on %s (%s)", dev, added.stderr.strip())
    if spec.bandwidth_mbit is not None:
        shell.run(tc + ["qdisc", "add", "dev", dev] + tbf_parent + tbf_args(spec.bandwidth_mbit))
    return latency_applied
