// The device side of gpu_probe, behind a small interface so the host side (gpu_probe.cc:
// processes, trials, timing, the lease, JSON) builds and is tested without a GPU.
// Two implementations, linked one at a time (ops/Makefile):
//   gpu_probe_cuda.cu  real kernels: a matrix-multiply loop and a spin kernel on a
//                      host-mapped flag (`make -C ops gpu_probe`, needs nvcc);
//   gpu_probe_cpu.cc   a CPU stand-in: busy loops, so that the host logic runs under g++.
// Every call is made from a child process after fork(); the parent never touches the device
// (a CUDA context does not survive fork()).
#ifndef CROSSOVER_TF_OPS_GPU_PROBE_GPU_PROBE_DEVICE_H_
#define CROSSOVER_TF_OPS_GPU_PROBE_GPU_PROBE_DEVICE_H_

#include <cstdint>
#include <string>

namespace gpu_probe {

// Opens the device in this process; *name says which device (or that it is the stand-in).
bool DeviceInit(std::string* name, std::string* error);
// Enqueues `units` units of compute (one unit: one matrix multiply) and returns; may run
// synchronously where the device has no queue (the stand-in).
void DeviceCompute(int64_t units);
// The `device` communication kind: keeps the device occupied by a kernel that spins until
// the host raises a flag after comm_ms, then waits for it. Bounded: the kernel also gives up
// on its own after a few seconds past comm_ms, so a lost flag cannot hang the GPU.
bool DeviceSpin(double comm_ms, std::string* error);
// Waits until everything enqueued has finished (the stream is synchronised).
bool DeviceSync(std::string* error);
void DeviceShutdown();
// True for the CPU stand-in: its numbers are never GPU numbers and the JSON says so.
bool DeviceIsStandIn();

}  // namespace gpu_probe

#endif  // CROSSOVER_TF_OPS_GPU_PROBE_GPU_PROBE_DEVICE_H_
