// See gpu_probe_worker.h.
#include "gpu_probe/gpu_probe_worker.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/device_lease.h"
#include "gpu_probe/gpu_probe_device.h"

namespace gpu_probe {
namespace {

constexpr double kLeaseTimeoutS = 30;       // a peer holding longer than this is wedged
constexpr int64_t kMaxUnits = int64_t{1} << 24;
constexpr double kCalibrationMinMs = 50;    // time enough units that timer noise is < 1%
constexpr double kCalibrationMaxMs = 10000;
constexpr int kCalibrationRounds = 4;

void SleepNs(int64_t ns) {
  if (ns <= 0) return;
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  nanosleep(&ts, nullptr);
}

[[noreturn]] void Fail(WorkerRecord* record, const std::string& message) {
  snprintf(record->error, sizeof(record->error), "%s", message.c_str());
  record->state.store(3);
  _exit(3);
}

// The mode decides whether this process is an MPS client: only with a daemon at its pipe
// directory (the parent gives the others an empty one, so a system daemon cannot join in).
void SetMpsEnv(const std::string& pipe_dir) {
  if (!pipe_dir.empty()) setenv("CUDA_MPS_PIPE_DIRECTORY", pipe_dir.c_str(), 1);
}

double TimeUnitsMs(int64_t units) {
  std::string error;
  const int64_t t0 = MonoNs();
  DeviceCompute(units);
  DeviceSync(&error);
  return (MonoNs() - t0) / 1e6;
}

}  // namespace

int64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kSolo: return "solo";
    case Mode::kNaive: return "naive";
    case Mode::kCrossover: return "crossover";
    case Mode::kMps: return "mps";
  }
  return "?";
}

const char* CommName(Comm comm) { return comm == Comm::kHost ? "host" : "device"; }

void RunCalibration(double compute_ms, const std::string& mps_pipe_dir, int64_t* units,
                    double* measured_ms, char* error, size_t error_len) {
  SetMpsEnv(mps_pipe_dir);
  std::string name, err;
  if (!DeviceInit(&name, &err)) {
    snprintf(error, error_len, "%s", err.c_str());
    _exit(3);
  }
  TimeUnitsMs(1);  // first launch pays for module loading; not part of any rate
  // Double the work until it takes long enough to time; bounded in count and in time.
  int64_t k = 1;
  double ms = TimeUnitsMs(k);
  while (ms < kCalibrationMinMs && k < kMaxUnits && ms < kCalibrationMaxMs) {
    k *= 2;
    ms = TimeUnitsMs(k);
  }
  // One slow timing (a preempted host, a clock ramp) would skew the rate, so correct it by
  // medians of 5 at the estimated size, a bounded number of times.
  int64_t u = std::max<int64_t>(1, static_cast<int64_t>(compute_ms * k / std::max(ms, 1e-6) + 0.5));
  double median_ms = 0;
  for (int round = 0; round < kCalibrationRounds; ++round) {
    std::vector<double> runs;
    for (int i = 0; i < 5; ++i) runs.push_back(TimeUnitsMs(u));
    std::sort(runs.begin(), runs.end());
    median_ms = runs[2];
    // Stop when close, or on the last round: *measured_ms must be of the units returned.
    if (std::abs(median_ms - compute_ms) < 0.03 * compute_ms || round + 1 == kCalibrationRounds) break;
    u = std::min(kMaxUnits, std::max<int64_t>(1, static_cast<int64_t>(u * compute_ms / std::max(median_ms, 1e-6) + 0.5)));
  }
  *units = u;
  *measured_ms = median_ms;
  DeviceShutdown();
  _exit(0);
}

void RunWorker(const WorkerConfig& config, SessionShared* shared, int index) {
  WorkerRecord* record = &shared->workers[index];
  SetMpsEnv(config.mps_pipe_dir);
  std::string name, error;
  if (!DeviceInit(&name, &error)) Fail(record, "device init: " + error);
  snprintf(record->device, sizeof(record->device), "%s", name.c_str());
  std::shared_ptr<crossover::DeviceLease> lease;
  if (config.mode == Mode::kCrossover) {
    const crossover::LeaseStatus status = crossover::DeviceLease::Get(config.group, "gpu0", &lease);
    if (!status.ok()) Fail(record, "lease: " + status.message);
  }
  TimeUnitsMs(config.units);  // warm the device before the clock starts
  record->state.store(1);
  const int64_t give_up = MonoNs() + static_cast<int64_t>(config.start_timeout_s * 1e9);
  while (shared->go.load() == 0 && MonoNs() < give_up) SleepNs(200000);
  if (shared->go.load() != 1) Fail(record, "no start signal");
  SleepNs(shared->start_ns - MonoNs());

  const int64_t comm_ns = static_cast<int64_t>(config.comm_ms * 1e6);
  int64_t n = 0;
  while (MonoNs() < shared->end_ns && n < kMaxSpans) {
    Span span{};
    record->step_begin_ns[n] = span.request_ns = MonoNs();
    if (lease) {
      const crossover::LeaseStatus acquired = lease->Acquire(kLeaseTimeoutS, n);
      if (!acquired.ok()) Fail(record, "acquire: " + acquired.message);
    }
    span.start_ns = MonoNs();
    DeviceCompute(config.units);
    if (lease) {
      // The lease goes back only once the stream has drained: the next holder must find the
      // device free. end_ns is taken while still holding, so recorded holds never overlap.
      const crossover::LeaseStatus released = lease->YieldAfter([&] {
        std::string sync_error;
        const bool ok = DeviceSync(&sync_error);
        span.end_ns = MonoNs();
        return ok ? crossover::LeaseStatus::Ok()
                  : crossover::LeaseStatus::Error(crossover::LeaseCode::kInternal, sync_error);
      });
      if (!released.ok()) Fail(record, "release: " + released.message);
    } else {
      if (!DeviceSync(&error)) Fail(record, "sync: " + error);
      span.end_ns = MonoNs();
    }
    record->spans[n] = span;
    if (config.comm == Comm::kHost) {
      SleepNs(comm_ns);  // waits on the host, as a Gloo allreduce does
    } else if (!DeviceSpin(config.comm_ms, &error)) {
      Fail(record, "spin: " + error);
    }
    record->step_end_ns[n] = MonoNs();
    record->n_spans = ++n;
  }
  DeviceShutdown();
  record->state.store(2);
  _exit(0);
}

}  // namespace gpu_probe
