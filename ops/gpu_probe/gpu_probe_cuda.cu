// gpu_probe's device side on a real GPU (gpu_probe_device.h), built by `make -C ops gpu_probe`.
//  * Compute: one unit is one 1024x1024 single-precision matrix multiply (a shared-memory
//    tiled kernel: 4096 blocks, enough to fill any current GPU), enqueued on this process's
//    stream; the host side calibrates how many units take C ms alone.
//  * Device communication: one thread spins on a flag in host-mapped memory until the host
//    raises it after M ms, as an NCCL kernel holds the GPU while it waits for the network.
//    The kernel also stops on its own a few seconds past M (%globaltimer), so a host that dies
//    before raising the flag cannot leave the GPU spinning.
#include <cuda_runtime.h>
#include <time.h>

#include <cstdint>
#include <string>

#include "gpu_probe/gpu_probe_device.h"

namespace gpu_probe {
namespace {

constexpr int kN = 1024;     // matrix side
constexpr int kTile = 16;    // kTile x kTile threads per block
constexpr uint64_t kSpinGraceNs = 5000000000ull;  // the spin kernel's own bound past comm_ms

cudaStream_t stream = nullptr;
float *a = nullptr, *b = nullptr, *c = nullptr;
volatile int* host_flag = nullptr;  // host-mapped: the host writes, the spin kernel reads
int* device_flag = nullptr;         // the same memory, as the device addresses it

__global__ void MatMul(const float* x, const float* y, float* z, int n) {
  __shared__ float xs[kTile][kTile], ys[kTile][kTile];
  const int row = blockIdx.y * kTile + threadIdx.y, col = blockIdx.x * kTile + threadIdx.x;
  float acc = 0;
  for (int t = 0; t < n; t += kTile) {
    xs[threadIdx.y][threadIdx.x] = x[row * n + t + threadIdx.x];
    ys[threadIdx.y][threadIdx.x] = y[(t + threadIdx.y) * n + col];
    __syncthreads();
    for (int k = 0; k < kTile; ++k) acc += xs[threadIdx.y][k] * ys[k][threadIdx.x];
    __syncthreads();
  }
  z[row * n + col] = acc;
}

__device__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void Spin(volatile int* flag, uint64_t bound_ns) {
  const uint64_t start = GlobalTimerNs();
  while (*flag == 0 && GlobalTimerNs() - start < bound_ns) {
  }
}

bool Check(cudaError_t err, const char* what, std::string* error) {
  if (err == cudaSuccess) return true;
  if (error) *error = std::string(what) + ": " + cudaGetErrorString(err);
  return false;
}

void SleepMs(double ms) {
  const int64_t ns = static_cast<int64_t>(ms * 1e6);
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  nanosleep(&ts, nullptr);
}

}  // namespace

bool DeviceInit(std::string* name, std::string* error) {
  int device = 0;
  cudaDeviceProp prop;
  if (!Check(cudaGetDevice(&device), "cudaGetDevice", error) ||
      !Check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties", error) ||
      !Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate", error))
    return false;
  *name = prop.name;
  const size_t bytes = sizeof(float) * kN * kN;
  void* flag = nullptr;
  if (!Check(cudaMalloc(&a, bytes), "cudaMalloc", error) ||
      !Check(cudaMalloc(&b, bytes), "cudaMalloc", error) ||
      !Check(cudaMalloc(&c, bytes), "cudaMalloc", error) ||
      !Check(cudaMemset(a, 0, bytes), "cudaMemset", error) ||
      !Check(cudaMemset(b, 0, bytes), "cudaMemset", error) ||
      !Check(cudaHostAlloc(&flag, sizeof(int), cudaHostAllocMapped), "cudaHostAlloc", error) ||
      !Check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_flag), flag, 0),
             "cudaHostGetDevicePointer", error))
    return false;
  host_flag = static_cast<volatile int*>(flag);
  return Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", error);
}

void DeviceCompute(int64_t units) {
  const dim3 grid(kN / kTile, kN / kTile), block(kTile, kTile);
  for (int64_t u = 0; u < units; ++u) MatMul<<<grid, block, 0, stream>>>(a, b, c, kN);
}

bool DeviceSpin(double comm_ms, std::string* error) {
  *host_flag = 0;
  __sync_synchronize();  // the flag is down before the kernel can read it
  const uint64_t bound = static_cast<uint64_t>(comm_ms * 1e6) + kSpinGraceNs;
  Spin<<<1, 1, 0, stream>>>(device_flag, bound);
  if (!Check(cudaGetLastError(), "Spin launch", error)) return false;
  SleepMs(comm_ms);  // the "network" time the kernel waits out
  *host_flag = 1;
  __sync_synchronize();
  return DeviceSync(error);
}

bool DeviceSync(std::string* error) {
  return Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize", error);
}

void DeviceShutdown() {
  cudaStreamSynchronize(stream);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  if (host_flag) cudaFreeHost(const_cast<int*>(host_flag));
  cudaStreamDestroy(stream);
}

bool DeviceIsStandIn() { return false; }

}  // namespace gpu_probe
