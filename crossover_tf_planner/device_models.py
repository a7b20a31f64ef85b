"""How jobs share one device when nothing schedules them, named and written down in one place.

Whether crossing pays depends on what naive co-location gets, and that depends on the device:

* ``cpu``: the emulated cluster of experiments/ (and any CPU training). Each host is one
  time-sliced core; Linux's scheduler runs whichever job has work, in slices of a few ms, far
  shorter than a step. Measured on that cluster, naive co-location reaches nearly the ideal
  overlap where the core bounds the round (README, "Measured here"), so naive is modelled
  *work-conserving* on the core: it is never idle while a job has work for it. A job's
  allreduce is not free for the core either: Gloo's reduction, the TCP stack, Horovod's
  background thread and TensorFlow's executor take ``comm_cpu_s`` CPU seconds per step from
  the core the other job computes on (``experiments.probes --mode=calibrate``).
  The core is not the only shared thing: the link is, and allreduces that nothing keeps apart
  overlap at random and move less than one at a time (``LinkContention.shared_efficiency``,
  measured by ``experiments.probes --mode=contention`` and by every comparison; README has the
  emulated cluster's). Where the link bounds a round (M > C), that caps naive co-location and
  plain crossing alike; link turns run one allreduce at a time and escape it, which is where
  crossing wins on a CPU. An allreduce also runs slower while its core computes
  (``compute_slowdown``), for every policy.
* ``gpu``: processes without MPS get separate contexts; only MPS "allows kernel and memcopy
  operations from different processes to overlap", and without it the processes' "scheduling
  resources must be swapped on and off the GPU" (NVIDIA, Multi-Process Service, introduction,
  https://docs.nvidia.com/deploy/mps/index.html, and "When to Use MPS"). So the device is
  time-sliced between jobs at a context-switch cost. Nothing makes two such jobs drift into
  anti-phase, so naive co-location is the fluid processor-sharing model of fluid.py averaged
  over random start offsets, with ``device_efficiency`` (1.0: free switching) the share of the
  device two contexts get together; the allreduce runs on the NIC and the host CPU, not on the
  device (``comm_on_device`` False). The link's measured contention applies as on a CPU (it is
  the network's, not the device's). Its default is not a measurement: the one probe run so far
  (an H200, docs/measurements.md) fitted device_efficiency 0.735, 0.544 and 0.345 at M/C 0.5,
  1 and 2, which no one constant fits. scripts/gpu_probe.sh measures a user's GPU without
  TensorFlow (ops/gpu_probe), and gpu_calibration.gpu_model turns its JSON into this model.
"""
from __future__ import annotations

import dataclasses

NAIVE_SHARING = ("work-conserving", "fluid")


@dataclasses.dataclass(frozen=True)
class DeviceModel:
    """One device's sharing behaviour, as the planner's policies use it."""

    name: str
    naive_sharing: str  # "work-conserving" (time-sliced core) or "fluid" (random phases)
    device_efficiency: float  # device throughput when two jobs share it, over one job's
    comm_on_device: bool  # whether a job's allreduce CPU work (comm_cpu_s) runs on the device
    source: str  # where the behaviour and parameters come from
    limitation: str = ""  # what the model cannot predict, printed beside its predictions

    def __post_init__(self) -> None:
        if self.naive_sharing not in NAIVE_SHARING:
            raise ValueError(f"naive_sharing must be one of {NAIVE_SHARING}, got "
                             f"{self.naive_sharing!r}")
        if not 0 < self.device_efficiency <= 1:
            raise ValueError(f"device_efficiency must be in (0, 1], got "
                             f"{self.device_efficiency}")


# Why the cpu model's crossover can never beat its naive: naive's round takes only the
# resources' totals, as if its jobs' phases always interleaved perfectly, while a crossed round
# takes the same totals and the serialised holds. What it misses: naive jobs that nothing keeps
# apart drift in and out of phase, sometimes computing together (the link idles) and sometimes
# allreducing together, which the lease's turns avoid. Modelling that drift on a time-sliced
# core (the fluid model with the comm-CPU cost and the slowed allreduces) is not done yet.
CPU_LIMITATION = (
    "Limitation of the cpu model: it cannot predict plain crossover above naive. It takes "
    "naive co-location to use the core and the link at once to the full (a round is the "
    "larger of the CPU both steps use and the link time both allreduces need), as if the "
    "jobs always fell into step with each other's gaps; a crossed round has the same bounds "
    "and its serialised holds besides, so it is never shorter. Naive jobs drift in and out "
    "of phase (at times both compute while the link idles), which the lease's turns avoid, "
    "so where crossover measures faster than naive its predicted crossover/naive of at most "
    "1.0 is a floor, not a prediction.")
CPU = DeviceModel(
    name="cpu", naive_sharing="work-conserving", device_efficiency=1.0, comm_on_device=True,
    source="measured on the emulated cluster (README 'Measured here'); comm_cpu_s from "
           "plan.py --mode=calibrate", limitation=CPU_LIMITATION)
GPU = DeviceModel(
    name="gpu", naive_sharing="fluid", device_efficiency=1.0, comm_on_device=False,
    source="NVIDIA Multi-Process Service docs (without MPS, kernels of different processes do "
           "not overlap and contexts are swapped): https://docs.nvidia.com/deploy/mps/index.html;"
           " device_efficiency not measured (scripts/gpu_probe.sh, gpu_calibration)")
DEVICE_MODELS = {model.name: model for model in (CPU, GPU)}


def limitation_of(name: str) -> str:
    """What the named model cannot predict ("" for none, or a model not registered here)."""
    model = DEVICE_MODELS.get(name)
    return model.limitation if model else ""


def device_model(name_or_model: str | DeviceModel, device_efficiency: float | None = None
                 ) -> DeviceModel:
    """The named model (a clear error for an unknown name), with device_efficiency replaced
    when one is given."""
    if isinstance(name_or_model, DeviceModel):
        model = name_or_model
    elif name_or_model in DEVICE_MODELS:
        model = DEVICE_MODELS[name_or_model]
    else:
        raise ValueError(f"unknown device model {name_or_model!r}; choose from "
                         f"{sorted(DEVICE_MODELS)}")
    if device_efficiency is None or device_efficiency == model.device_efficiency:
        return model
    return dataclasses.replace(model, device_efficiency=device_efficiency)
