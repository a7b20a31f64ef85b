// gpu_probe: does crossing (the lease) beat naive co-location on *this* GPU, without
// TensorFlow? N processes (2 by default, up to 4) share one device; each loops a compute phase
// (kernels calibrated to C ms alone) and a communication phase of M ms, either on the host
// (`host`: a sleep, as a Gloo allreduce waits) or on the device (`device`: a kernel spins on a
// host-mapped flag, as an NCCL kernel holds the GPU). Modes run side by side in interleaved
// trials (the order rotates each trial, so drift hits every mode alike):
//   solo       one process alone (the reference every ratio divides by);
//   naive      N processes, nothing schedules them;
//   crossover  N processes sharing the GPU one at a time through the lease core (device_lease.h),
//              released after the stream is synchronised;
//   mps        naive under an MPS daemon this probe starts (skipped where it cannot).
// Usage (every flag optional):
//   gpu_probe --procs=2 --compute_ms=20 --ratios=0.5,1,2 --comm=host,device
//             --modes=solo,naive,crossover,mps --trials=3 --window_ms=3000 --warmup_ms=500
//             --out=probe.json --md=probe.md --mps_control=nvidia-cuda-mps-control
// Output: JSON (schema in gpu_probe_json.cc) and a markdown table; steps/s per process, each
// ratio as median [min-max] over trials, device busy time and lease hand-off times.
// Built for a GPU by `make -C ops gpu_probe`; `make -C ops gpu_probe_cpu` links a CPU stand-in
// for the device (gpu_probe_cpu.cc) so this logic is tested without one.
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_probe/gpu_probe_device.h"
#include "gpu_probe/gpu_probe_json.h"
#include "gpu_probe/gpu_probe_summary.h"
#include "gpu_probe/gpu_probe_worker.h"

namespace gpu_probe {
namespace {

[[noreturn]] void Die(const std::string& msg) {
  fprintf(stderr, "gpu_probe: %s\n", msg.c_str());
  exit(2);
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const size_t end = comma == std::string::npos ? s.size() : comma;
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

double ParseDouble(const std::string& flag, const std::string& value, double lo, double hi) {
  char* end = nullptr;
  const double v = strtod(value.c_str(), &end);
  if (end == value.c_str() || *end != '\0' || !(v >= lo && v <= hi))
    Die("--" + flag + " must be a number in [" + std::to_string(lo) + ", " +
        std::to_string(hi) + "], got '" + value + "'");
  return v;
}

Settings ParseArgs(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) Die("expected --flag=value: " + arg);
    const std::string key = arg.substr(2, eq - 2), value = arg.substr(eq + 1);
    if (key == "procs") s.procs = static_cast<int>(ParseDouble(key, value, 2, kMaxProcs));
    else if (key == "compute_ms") s.compute_ms = ParseDouble(key, value, 0.1, 1000);
    else if (key == "trials") s.trials = static_cast<int>(ParseDouble(key, value, 1, 20));
    else if (key == "window_ms") s.window_ms = ParseDouble(key, value, 10, 60000);
    else if (key == "warmup_ms") s.warmup_ms = ParseDouble(key, value, 0, 10000);
    else if (key == "out") s.out = value;
    else if (key == "md") s.md = value;
    else if (key == "mps_control") s.mps_control = value;
    else if (key == "ratios") {
      s.ratios.clear();
      for (const auto& r : Split(value)) s.ratios.push_back(ParseDouble(key, r, 0, 100));
    } else if (key == "comm") {
      s.comms.clear();
      for (const auto& c : Split(value)) {
        if (c == "host") s.comms.push_back(Comm::kHost);
        else if (c == "device") s.comms.push_back(Comm::kDevice);
        else Die("--comm takes host and/or device, got '" + c + "'");
      }
    } else if (key == "modes") {
      s.modes.clear();
      for (const auto& m : Split(value)) {
        if (m == "solo") s.modes.push_back(Mode::kSolo);
        else if (m == "naive") s.modes.push_back(Mode::kNaive);
        else if (m == "crossover") s.modes.push_back(Mode::kCrossover);
        else if (m == "mps") s.modes.push_back(Mode::kMps);
        else Die("--modes takes solo, naive, crossover, mps; got '" + m + "'");
      }
    } else {
      Die("unknown flag --" + key);
    }
  }
  if (s.ratios.empty() || s.comms.empty() || s.modes.empty())
    Die("--ratios, --comm and --modes need at least one value each");
  if (s.ratios.size() * s.comms.size() * s.modes.size() * s.trials > 400)
    Die("too many sessions (ratios x comm x modes x trials > 400)");
  return s;
}

// Waits for a child until deadline (monotonic ns), then kills it. True if it exited with 0.
bool WaitChild(pid_t pid, int64_t deadline) {
  int status = 0;
  while (true) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (r < 0) return false;
    if (MonoNs() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return false;
    }
    usleep(2000);
  }
}

template <typename T>
T* MapShared() {
  void* p = mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) Die("mmap failed");
  memset(p, 0, sizeof(T));
  return static_cast<T*>(p);
}

struct CalibrationShared {
  int64_t units;
  double measured_ms;
  char error[256];
};

// The MPS daemon, with private pipe and log directories, started for each mps session and
// quit after it: while an MPS server runs, the other modes' processes would share the GPU with
// it, so they never run beside one (and get an empty pipe directory, so they never become
// clients of a system daemon either).
struct Mps {
  bool usable = false;  // asked for, and no start has failed yet
  std::string reason, pipe_dir, log_dir, control;

  std::string Env() const {
    return "CUDA_MPS_PIPE_DIRECTORY='" + pipe_dir + "' CUDA_MPS_LOG_DIRECTORY='" + log_dir + "' ";
  }
  void Init(bool wanted, const std::string& control_cmd, const std::string& base) {
    control = control_cmd;
    pipe_dir = base + "/mps_pipe";
    log_dir = base + "/mps_log";
    mkdir(pipe_dir.c_str(), 0700);
    mkdir(log_dir.c_str(), 0700);
    usable = wanted && !DeviceIsStandIn();
    reason = !wanted ? "not asked for" : DeviceIsStandIn() ? "CPU stand-in: there is no MPS" : "";
  }
  bool Start() {
    if (!usable) return false;
    const std::string cmd = Env() + "timeout 20 " + control + " -d >/dev/null 2>&1";
    if (system(cmd.c_str()) != 0) {
      usable = false;
      reason = "could not start '" + control + " -d' (missing, or not permitted here)";
    }
    return usable;
  }
  void Stop() {
    const std::string cmd = "echo quit | " + Env() + "timeout 20 " + control + " >/dev/null 2>&1";
    if (system(cmd.c_str()) != 0) fprintf(stderr, "gpu_probe: stopping MPS failed\n");
    usleep(500000);  // the daemon and its server exit asynchronously after `quit`
  }
};

Calibration Calibrate(const Settings& s, const std::string& no_mps_dir) {
  auto* shared = MapShared<CalibrationShared>();
  const pid_t pid = fork();
  if (pid < 0) Die("fork failed");
  if (pid == 0) {
    RunCalibration(s.compute_ms, no_mps_dir, &shared->units, &shared->measured_ms,
                   shared->error, sizeof(shared->error));
  }
  if (!WaitChild(pid, MonoNs() + int64_t{120} * 1000000000))
    Die(std::string("calibration failed: ") + shared->error);
  Calibration c{shared->units, shared->measured_ms};
  munmap(shared, sizeof(CalibrationShared));
  return c;
}

SessionResult RunSession(const Settings& s, Mode mode, Comm comm, double comm_ms, int64_t units,
                         const std::string& group, const Mps& mps, const std::string& no_mps_dir) {
  SessionResult result;
  result.mode = mode;
  const int procs = mode == Mode::kSolo ? 1 : s.procs;
  auto* shared = MapShared<SessionShared>();
  WorkerConfig config{mode, comm, units, comm_ms, group,
                      mode == Mode::kMps ? mps.pipe_dir : no_mps_dir, 60.0};
  std::vector<pid_t> pids;
  for (int p = 0; p < procs; ++p) {
    const pid_t pid = fork();
    if (pid < 0) Die("fork failed");
    if (pid == 0) RunWorker(config, shared, p);
    pids.push_back(pid);
  }
  // Start together once all are ready (device open, warmed), or give up after 60 s.
  const int64_t ready_by = MonoNs() + int64_t{60} * 1000000000;
  auto all = [&](int state) {
    for (int p = 0; p < procs; ++p)
      if (shared->workers[p].state.load() < state) return false;
    return true;
  };
  while (!all(1) && MonoNs() < ready_by) usleep(1000);
  bool ok = all(1);
  for (int p = 0; p < procs; ++p) ok = ok && shared->workers[p].state.load() != 3;
  const int64_t warmup = static_cast<int64_t>(s.warmup_ms * 1e6);
  const int64_t window = static_cast<int64_t>(s.window_ms * 1e6);
  shared->start_ns = MonoNs() + 20000000;
  shared->end_ns = shared->start_ns + warmup + window;
  shared->go.store(ok ? 1 : -1);
  // A step may outlast the window by one compute + one communication phase.
  const int64_t deadline = shared->end_ns + int64_t{60} * 1000000000;
  for (pid_t pid : pids) ok = WaitChild(pid, deadline) && ok;
  for (int p = 0; p < procs; ++p) {
    const WorkerRecord& r = shared->workers[p];
    if (r.error[0]) result.error += std::string(result.error.empty() ? "" : "; ") + r.error;
    if (r.device[0]) result.device = r.device;
  }
  if (!ok && result.error.empty()) result.error = "a process failed or timed out";
  result.ok = ok;
  const int64_t t0 = shared->start_ns + warmup, t1 = shared->end_ns;
  for (int p = 0; p < procs; ++p) {
    result.steps_per_s.push_back(StepsPerS(shared->workers[p], t0, t1));
    std::vector<double> compute_ms;
    const WorkerRecord& r = shared->workers[p];
    for (int64_t k = 0; k < r.n_spans && k < kMaxSpans; ++k)
      if (r.spans[k].start_ns >= t0) compute_ms.push_back((r.spans[k].end_ns - r.spans[k].start_ns) / 1e6);
    result.compute_ms.push_back(Summarise(compute_ms).median);
  }
  const std::vector<Phase> phases = PhasesIn(*shared, procs, t0, t1);
  result.busy_fraction = BusyFraction(phases, t0, t1);
  result.handoff_us = HandoffUs(phases);
  result.overlaps = Overlaps(phases);
  if (mode == Mode::kCrossover) {
    for (const Phase& ph : phases) {
      if (result.holds.size() >= kMaxHoldsInJson) break;
      result.holds.push_back({ph.proc, (ph.span.request_ns - t0) / 1e6,
                              (ph.span.start_ns - t0) / 1e6, (ph.span.end_ns - t0) / 1e6});
    }
  }
  munmap(shared, sizeof(SessionShared));
  return result;
}

}  // namespace
}  // namespace gpu_probe

int main(int argc, char** argv) {
  using namespace gpu_probe;
  const Settings s = ParseArgs(argc, argv);
  char base_template[] = "/tmp/gpu_probe.XXXXXX";
  if (!mkdtemp(base_template)) Die("mkdtemp failed");
  const std::string base = base_template;
  const std::string no_mps_dir = base + "/no_mps";
  mkdir(no_mps_dir.c_str(), 0700);
  const std::string group = "gpuprobe" + std::to_string(getpid());

  Report report;
  report.settings = s;
  report.stand_in = DeviceIsStandIn();
  report.calibration = Calibrate(s, no_mps_dir);
  Mps mps;
  bool want_mps = false;
  for (Mode m : s.modes) want_mps = want_mps || m == Mode::kMps;
  mps.Init(want_mps, s.mps_control, base);
  bool mps_ran = false;
  fprintf(stderr, "gpu_probe: %lld units take %.2f ms alone\n",
          static_cast<long long>(report.calibration.units), report.calibration.measured_ms);

  for (double ratio : s.ratios) {
    for (Comm comm : s.comms) {
      Point point;
      point.ratio = ratio;
      point.comm = comm;
      point.comm_ms = ratio * s.compute_ms;
      for (int trial = 0; trial < s.trials; ++trial) {
        for (size_t i = 0; i < s.modes.size(); ++i) {
          const Mode mode = s.modes[(i + trial) % s.modes.size()];  // rotate: interleaved
          if (mode == Mode::kMps && !mps.Start()) continue;
          SessionResult r = RunSession(s, mode, comm, point.comm_ms, report.calibration.units,
                                       group, mps, no_mps_dir);
          if (mode == Mode::kMps) {
            mps.Stop();
            mps_ran = true;
          }
          r.trial = trial;
          if (!r.device.empty()) report.device = r.device;
          if (!r.ok) fprintf(stderr, "gpu_probe: %s failed: %s\n", ModeName(mode), r.error.c_str());
          point.sessions.push_back(r);
        }
      }
      fprintf(stderr, "gpu_probe: M/C=%g %s done\n", ratio, CommName(comm));
      report.points.push_back(point);
    }
  }
  report.mps_available = mps_ran && mps.usable;
  report.mps_reason = mps.reason;
  shm_unlink(("/crossover." + group + ".gpu0").c_str());
  // base came from mkdtemp above; it holds only the MPS pipe/log directories.
  if (system(("rm -rf '" + base + "'").c_str()) != 0) fprintf(stderr, "gpu_probe: cannot remove %s\n", base.c_str());
  const std::string json = ReportJson(report);
  const std::string md = ReportMarkdown(report);
  if (!s.out.empty() && !WriteFile(s.out, json)) Die("cannot write " + s.out);
  if (!s.md.empty() && !WriteFile(s.md, md)) Die("cannot write " + s.md);
  printf("%s", md.c_str());
  bool all_ok = true;
  for (const Point& p : report.points)
    for (const SessionResult& r : p.sessions) all_ok = all_ok && r.ok;
  return all_ok ? 0 : 1;
}
