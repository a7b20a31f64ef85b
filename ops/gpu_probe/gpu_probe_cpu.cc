// CPU stand-in for gpu_probe's device side (gpu_probe_device.h): compute is a busy loop on
// this process's CPU, so the host logic (phases, modes, lease, JSON) can be built with g++ and
// tested on machines without a GPU. Its numbers measure a CPU, never a GPU.
#include <time.h>

#include <cstdint>
#include <string>

#include "gpu_probe/gpu_probe_device.h"

namespace gpu_probe {
namespace {

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

volatile double sink;  // keeps the compiler from removing the loop

}  // namespace

bool DeviceInit(std::string* name, std::string* /*error*/) {
  *name = "cpu-standin (not a GPU)";
  return true;
}

void DeviceCompute(int64_t units) {
  // One unit: a fixed amount of floating-point work, like one matmul on the GPU.
  double acc = 0;
  for (int64_t u = 0; u < units; ++u) {
    for (int i = 0; i < 2000; ++i) acc += 1e-9 * (i ^ u);
  }
  sink = acc;
}

bool DeviceSpin(double comm_ms, std::string* /*error*/) {
  // The stand-in's "device" is this CPU, so occupying it means spinning for comm_ms.
  const int64_t end = NowNs() + static_cast<int64_t>(comm_ms * 1e6);
  while (NowNs() < end) {
  }
  return true;
}

bool DeviceSync(std::string* /*error*/) { return true; }  // compute ran synchronously
void DeviceShutdown() {}
bool DeviceIsStandIn() { return true; }

}  // namespace gpu_probe
