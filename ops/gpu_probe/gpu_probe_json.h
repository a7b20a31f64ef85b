// gpu_probe's results and their two renderings: the JSON the planner reads
// (crossover_tf_planner/gpu_calibration.py) and a markdown table for people.
#ifndef CROSSOVER_TF_OPS_GPU_PROBE_GPU_PROBE_JSON_H_
#define CROSSOVER_TF_OPS_GPU_PROBE_GPU_PROBE_JSON_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu_probe/gpu_probe_worker.h"

namespace gpu_probe {

constexpr size_t kMaxHoldsInJson = 5000;  // per session; enough for any default window

struct Settings {
  int procs = 2;
  double compute_ms = 20;
  std::vector<double> ratios = {1.0};
  std::vector<Comm> comms = {Comm::kHost, Comm::kDevice};
  std::vector<Mode> modes = {Mode::kSolo, Mode::kNaive, Mode::kCrossover, Mode::kMps};
  int trials = 3;
  double window_ms = 3000, warmup_ms = 500;
  std::string out, md, mps_control = "nvidia-cuda-mps-control";
};

struct Calibration {
  int64_t units = 0;
  double measured_ms = 0;
};

// One hold of the lease, in ms from the counting window's start: proc, requested, acquired,
// released (taken before the release, so spans of a correct lease never overlap).
struct Hold {
  int proc;
  double request_ms, start_ms, end_ms;
};

struct SessionResult {
  int trial = 0;
  Mode mode = Mode::kSolo;
  bool ok = false;
  std::string error, device;
  std::vector<double> steps_per_s;  // per process
  std::vector<double> compute_ms;   // per process, median compute phase (launch to sync)
  double busy_fraction = 0;         // share of the window some process was computing
  std::vector<double> handoff_us;
  int overlaps = 0;
  std::vector<Hold> holds;          // crossover only
};

struct Point {
  double ratio = 1, comm_ms = 0;
  Comm comm = Comm::kHost;
  std::vector<SessionResult> sessions;
};

struct Report {
  Settings settings;
  bool stand_in = false;
  std::string device;
  Calibration calibration;
  bool mps_available = false;
  std::string mps_reason;
  std::vector<Point> points;
};

std::string ReportJson(const Report& report);
std::string ReportMarkdown(const Report& report);
bool WriteFile(const std::string& path, const std::string& text);

}  // namespace gpu_probe

#endif  // CROSSOVER_TF_OPS_GPU_PROBE_GPU_PROBE_JSON_H_
