// One probe process's side of a session (gpu_probe.cc forks it): open the device, wait for the
// common start, then loop compute phase + communication phase until the window ends, recording
// every compute phase's span (CLOCK_MONOTONIC, one clock for all processes of the host) into
// memory shared with the parent. Plain C++17 but for the device calls (gpu_probe_device.h).
#ifndef CROSSOVER_TF_OPS_GPU_PROBE_GPU_PROBE_WORKER_H_
#define CROSSOVER_TF_OPS_GPU_PROBE_GPU_PROBE_WORKER_H_

#include <atomic>
#include <cstdint>
#include <string>

namespace gpu_probe {

constexpr int kMaxProcs = 4;
constexpr int kMaxSpans = 20000;  // compute phases one process records in one session

enum class Mode { kSolo, kNaive, kCrossover, kMps };
enum class Comm { kHost, kDevice };
const char* ModeName(Mode mode);
const char* CommName(Comm comm);

// One compute phase: asked for the device (lease request; == start without a lease), began
// (lease acquired), ended (stream synchronised, before the lease is released).
struct Span {
  int64_t request_ns, start_ns, end_ns;
};

struct WorkerRecord {
  std::atomic<int32_t> state;  // 0 starting, 1 ready, 2 done, 3 failed
  char device[128];
  char error[256];
  int64_t n_spans;
  int64_t step_begin_ns[kMaxSpans];  // step k = compute span k + its communication phase
  int64_t step_end_ns[kMaxSpans];
  Span spans[kMaxSpans];
};

// Anonymous shared memory that the parent maps before forking a session's workers.
struct SessionShared {
  std::atomic<int32_t> go;  // 1: start_ns/end_ns are set; -1: abort
  int64_t start_ns, end_ns;
  WorkerRecord workers[kMaxProcs];
};

struct WorkerConfig {
  Mode mode;
  Comm comm;
  int64_t units;       // compute units per step (calibrated to compute_ms)
  double comm_ms;
  std::string group;   // lease group (crossover)
  std::string mps_pipe_dir;  // CUDA_MPS_PIPE_DIRECTORY for this process
  double start_timeout_s;
};

// Runs in the forked child; never returns (exits with 0 on success).
[[noreturn]] void RunWorker(const WorkerConfig& config, SessionShared* shared, int index);

// Calibration, run in its own forked child: finds the units that take compute_ms alone and
// writes them and the measured time of one such phase (median of 5) to *units, *measured_ms.
[[noreturn]] void RunCalibration(double compute_ms, const std::string& mps_pipe_dir,
                                 int64_t* units, double* measured_ms, char* error,
                                 size_t error_len);

int64_t MonoNs();

}  // namespace gpu_probe

#endif  // CROSSOVER_TF_OPS_GPU_PROBE_GPU_PROBE_WORKER_H_
