"""bring_up: one rank's lease, link turn, device and key, made once into its StepProtocol.

They are set up in the order that makes them safe: devices pinned before TensorFlow starts
them; every rank's group and device checked before any lease is opened; the group's jobs met
on the lease (or a clear error) before the first step; the link turn last, since joining it
is a collective of the job's own ranks.
"""
from __future__ import annotations

import os
import re
import socket
from typing import Any

import tensorflow as tf
from absl import logging

from crossover_tf._setup import devices
from crossover_tf._setup import gpu_processes
from crossover_tf import lease as lease_lib
from crossover_tf._communication.communicator import Communicator
from crossover_tf._protocol.step_protocol import StepProtocol
from crossover_tf.options import (CommunicationOptions, DeviceOptions, LeaseOptions,
                                  LinkTurnOptions)

_JOB_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_.:@-]+")  # lease.validate_job's characters


def bring_up(group: str, lease: LeaseOptions, link_turn: LinkTurnOptions | None,
             device: DeviceOptions, communication: CommunicationOptions,
             comm: Communicator) -> StepProtocol:
    """Sets this rank up, in the order that makes it safe (module docstring), and returns its
    step protocol. Collective: every rank of the job calls it."""
    memory = devices.GpuMemoryPolicy(growth=device.memory_growth,
                                     limit_mb=device.memory_limit_mb)
    gpu_ordinal = _configure_devices(device.configure, memory, comm)
    comm.start()
    driver = devices.CudaDriver() if gpu_ordinal is not None else None
    device_key = device.device_key or devices.device_key(comm.local_rank, gpu_ordinal, driver)
    first_rank = _check_consistent_across_ranks(group, device_key, comm,
                                                communication.bucket_bytes)
    device_lease = (lease_lib.DeviceLease(
        group, device_key, lease.timeout_s, lease.priority, lease_dir=lease.lease_dir,
        shared_group=lease.shared_group, job=lease.job or default_job_label(first_rank))
        if group else None)
    members = _join_group(device_lease, lease, comm) if device_lease is not None else []
    if device_lease is not None and gpu_ordinal is not None:  # someone outside computes?
        gpu_processes.warn_about_outsiders(
            gpu_processes.Nvml(), devices.read_device_uuid(driver, gpu_ordinal), members, group)
    link_turns = (lease_lib.LinkTurn(device_lease, link_turn.position, lease.jobs,
                                     comm.agree_on_min, link_turn.wait_s, comm.barrier)
                  if device_lease is not None and link_turn is not None else None)
    local_device = devices.local_device_name(
        comm.own_devices(tf.config.list_logical_devices("GPU")),
        comm.own_devices(tf.config.list_logical_devices("CPU")), comm.local_rank)
    return StepProtocol(
        group, lease, link_turn, device, communication, comm, device_key, local_device,
        devices.allreduce_device(communication.allreduce_on, device_lease is not None,
                                 local_device),
        device_lease, link_turns, tuple(members))


def _join_group(lease: lease_lib.DeviceLease, options: LeaseOptions,
                comm: Communicator) -> list[Any]:
    """Waits until the group's jobs are all on this rank's device lease; every rank raises
    if any rank failed to join, for whatever reason (a short group, a directory that fails
    the trust rule, a renamed segment), so no rank goes on into a collective that the
    others left, and no rank is left waiting in this one."""
    error: Exception | None = None
    try:
        members, problem = lease.wait_for_jobs(options.jobs, options.join_timeout_s), None
    except Exception as err:  # noqa: BLE001 -- agreed across ranks, then raised below
        members, error = [], err
        problem = (type(err).__name__, getattr(err, "message", None) or str(err))
    problems = comm.gather(problem)
    failed = [(rank, p) for rank, p in enumerate(problems) if p]
    if failed:
        rank, (kind, first) = failed[0]
        ranks = ", ".join(str(r) for r, _ in failed)
        message = (f"crossover_tf: rank(s) {ranks} of this job could not join the group's "
                   f"lease. Rank {rank}: {kind}: {first}")
        kinds = {p[0] for _, p in failed}
        group_errors = {k.__name__: k for k in (lease_lib.GroupIncomplete, lease_lib.GroupOverfull)}
        kind = group_errors.get(kinds.pop(), RuntimeError) if len(kinds) == 1 else RuntimeError
        raise kind(message) from error
    logging.info("crossover_tf: rank %d joined %s with %s", comm.rank, lease, members)
    return members


def _configure_devices(configure: bool, memory: devices.GpuMemoryPolicy,
                       comm: Communicator) -> int | None:
    """Pins this rank's GPU (before TF initialises devices); returns its CUDA ordinal."""
    gpus = tf.config.list_physical_devices("GPU")  # does not initialise the runtime
    if not gpus:
        return None
    if configure:
        chosen = devices.configure_local_gpu(tf.config, memory, comm.local_rank,
                                             comm.local_size,
                                             tf.config.LogicalDeviceConfiguration)
    else:
        chosen = gpus[comm.local_rank % len(gpus)]
    return devices.physical_gpu_ordinal(gpus, chosen)


def _check_consistent_across_ranks(group: str, device_key: str, comm: Communicator,
                                   bucket_bytes: int = 0) -> dict[str, Any]:
    """Fails fast on configuration that would deadlock or silently mis-schedule later (ranks
    with different bucket_bytes would build different collectives and wait in them);
    returns rank 0's description (its host and pid name the job by default)."""
    mine = {"group": group, "host": socket.gethostname(), "device_key": device_key,
            "pid": os.getpid(), "bucket_bytes": bucket_bytes}
    everyone = comm.gather(mine)
    if len({c["bucket_bytes"] for c in everyone}) > 1:
        per_rank = ", ".join(f"rank {r}: {c['bucket_bytes']}" for r, c in enumerate(everyone))
        raise ValueError("crossover_tf: ranks of one job must use the same "
                         f"CommunicationOptions.bucket_bytes; got {per_rank}")
    groups = sorted({c["group"] for c in everyone})
    if len(groups) > 1:
        per_rank = ", ".join(f"rank {r}: {c['group']!r}" for r, c in enumerate(everyone))
        raise ValueError("crossover_tf: ranks of one job must use the same crossover group; "
                         f"got {per_rank}")
    seen: dict[tuple[str, str], int] = {}
    for r, c in enumerate(everyone):
        where = (c["host"], c["device_key"])
        if where in seen and group:
            raise ValueError(
                f"crossover_tf: ranks {seen[where]} and {r} of one job share device key "
                f"{c['device_key']!r} on host {c['host']!r}; they would serialise each "
                "other. Give each local rank its own device (CROSSOVER_DEVICE_KEY).")
        seen[where] = r
    return everyone[0]


def default_job_label(first_rank: dict[str, Any]) -> str:
    """A job's name on the lease when it gives none: rank 0's host and pid, which every rank
    of the job shares and no other job has at once."""
    host = _JOB_LABEL_UNSAFE.sub("-", str(first_rank["host"]))[:40] or "host"
    return f"{host}:{first_rank['pid']}"
