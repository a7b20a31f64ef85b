// See gpu_probe_json.h. Ratios are formed within a trial (the modes of one trial ran side by
// side in time) and then summarised over trials as median [min-max].
#include "gpu_probe/gpu_probe_json.h"

#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

#include "gpu_probe/gpu_probe_summary.h"

namespace gpu_probe {
namespace {

const Mode kModes[] = {Mode::kSolo, Mode::kNaive, Mode::kCrossover, Mode::kMps};

std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

std::string Str(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string List(const std::vector<double>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + Num(values[i]);
  return out + "]";
}

std::string SummaryJson(const std::vector<double>& values) {
  const Summary s = Summarise(values);
  if (s.n == 0) return "null";
  return "{\"median\": " + Num(s.median) + ", \"min\": " + Num(s.min) + ", \"max\": " +
         Num(s.max) + ", \"n\": " + std::to_string(s.n) + ", \"values\": " + List(values) + "}";
}

const SessionResult* Find(const Point& point, Mode mode, int trial) {
  for (const SessionResult& r : point.sessions)
    if (r.mode == mode && r.trial == trial && r.ok) return &r;
  return nullptr;
}

double Aggregate(const SessionResult& r) {
  return std::accumulate(r.steps_per_s.begin(), r.steps_per_s.end(), 0.0);
}

int Trials(const Point& point) {
  int trials = 0;
  for (const SessionResult& r : point.sessions) trials = std::max(trials, r.trial + 1);
  return trials;
}

// Per trial: the aggregate steps/s of `num` over that of `den` (both must have run and be ok).
std::vector<double> RatioValues(const Point& point, Mode num, Mode den) {
  std::vector<double> values;
  for (int t = 0; t < Trials(point); ++t) {
    const SessionResult *a = Find(point, num, t), *b = Find(point, den, t);
    if (a && b && Aggregate(*b) > 0) values.push_back(Aggregate(*a) / Aggregate(*b));
  }
  return values;
}

// Per trial and process: that process's steps/s over solo's (what each job keeps of its speed).
std::vector<double> PerProcessValues(const Point& point, Mode mode) {
  std::vector<double> values;
  for (int t = 0; t < Trials(point); ++t) {
    const SessionResult *a = Find(point, mode, t), *solo = Find(point, Mode::kSolo, t);
    if (!a || !solo || Aggregate(*solo) <= 0) continue;
    for (double sps : a->steps_per_s) values.push_back(sps / Aggregate(*solo));
  }
  return values;
}

std::vector<double> Collect(const Point& point, Mode mode, double (*get)(const SessionResult&)) {
  std::vector<double> values;
  for (const SessionResult& r : point.sessions)
    if (r.mode == mode && r.ok) values.push_back(get(r));
  return values;
}

std::vector<double> Handoffs(const Point& point) {
  std::vector<double> all;
  for (const SessionResult& r : point.sessions)
    if (r.mode == Mode::kCrossover && r.ok) all.insert(all.end(), r.handoff_us.begin(), r.handoff_us.end());
  return all;
}

int CrossoverOverlaps(const Point& point) {
  int n = 0;
  for (const SessionResult& r : point.sessions)
    if (r.mode == Mode::kCrossover) n += r.overlaps;
  return n;
}

struct NamedRatio {
  const char* name;
  Mode num, den;
};
const NamedRatio kRatios[] = {
    {"naive_vs_solo", Mode::kNaive, Mode::kSolo},
    {"crossover_vs_solo", Mode::kCrossover, Mode::kSolo},
    {"mps_vs_solo", Mode::kMps, Mode::kSolo},
    {"crossover_vs_naive", Mode::kCrossover, Mode::kNaive},
    {"crossover_vs_mps", Mode::kCrossover, Mode::kMps},
};

std::string SessionJson(const SessionResult& r) {
  std::ostringstream o;
  o << "{\"trial\": " << r.trial << ", \"mode\": " << Str(ModeName(r.mode))
    << ", \"ok\": " << (r.ok ? "true" : "false") << ", \"error\": " << Str(r.error)
    << ", \"steps_per_s\": " << List(r.steps_per_s) << ", \"compute_ms\": " << List(r.compute_ms)
    << ", \"busy_fraction\": " << Num(r.busy_fraction) << ", \"overlaps\": " << r.overlaps
    << ", \"handoff_us\": " << SummaryJson(r.handoff_us) << ", \"holds\": [";
  for (size_t i = 0; i < r.holds.size(); ++i) {
    const Hold& h = r.holds[i];
    o << (i ? ", " : "") << "[" << h.proc << ", " << Num(h.request_ms) << ", "
      << Num(h.start_ms) << ", " << Num(h.end_ms) << "]";
  }
  o << "]}";
  return o.str();
}

std::string PointJson(const Point& p) {
  std::ostringstream o;
  o << "{\"ratio\": " << Num(p.ratio) << ", \"comm\": " << Str(CommName(p.comm))
    << ", \"comm_ms\": " << Num(p.comm_ms) << ",\n   \"ratios\": {";
  bool first = true;
  for (const NamedRatio& nr : kRatios) {
    o << (first ? "" : ", ") << Str(nr.name) << ": " << SummaryJson(RatioValues(p, nr.num, nr.den));
    first = false;
  }
  o << "},\n   \"per_process_vs_solo\": {";
  first = true;
  for (Mode m : kModes) {
    if (m == Mode::kSolo) continue;
    o << (first ? "" : ", ") << Str(ModeName(m)) << ": " << SummaryJson(PerProcessValues(p, m));
    first = false;
  }
  o << "},\n   \"aggregate_steps_per_s\": {";
  first = true;
  for (Mode m : kModes) {
    o << (first ? "" : ", ") << Str(ModeName(m)) << ": " << SummaryJson(Collect(p, m, Aggregate));
    first = false;
  }
  o << "},\n   \"busy_fraction\": {";
  first = true;
  for (Mode m : kModes) {
    o << (first ? "" : ", ") << Str(ModeName(m)) << ": "
      << SummaryJson(Collect(p, m, [](const SessionResult& r) { return r.busy_fraction; }));
    first = false;
  }
  o << "},\n   \"handoff_us\": " << SummaryJson(Handoffs(p))
    << ", \"crossover_overlaps\": " << CrossoverOverlaps(p) << ",\n   \"sessions\": [\n    ";
  for (size_t i = 0; i < p.sessions.size(); ++i)
    o << (i ? ",\n    " : "") << SessionJson(p.sessions[i]);
  o << "]}";
  return o.str();
}

std::string Cell(const std::vector<double>& values, const char* fmt) {
  const Summary s = Summarise(values);
  if (s.n == 0) return "-";
  char buf[128];
  std::string f = std::string(fmt) + " [" + fmt + "-" + fmt + "]";
  snprintf(buf, sizeof(buf), f.c_str(), s.median, s.min, s.max);
  return buf;
}

}  // namespace

std::string ReportJson(const Report& r) {
  const Settings& s = r.settings;
  std::ostringstream o;
  o << "{\"probe\": \"gpu_probe\", \"schema\": 1, \"stand_in\": " << (r.stand_in ? "true" : "false")
    << ",\n \"note\": "
    << Str(r.stand_in ? "CPU stand-in (gpu_probe_cpu): compute is a CPU busy loop; these are "
                        "NOT GPU numbers, only a test of the probe's host logic"
                      : "measured on a GPU by ops/gpu_probe")
    << ",\n \"device\": " << Str(r.device) << ",\n \"settings\": {\"procs\": " << s.procs
    << ", \"compute_ms\": " << Num(s.compute_ms) << ", \"trials\": " << s.trials
    << ", \"window_ms\": " << Num(s.window_ms) << ", \"warmup_ms\": " << Num(s.warmup_ms)
    << ", \"ratios\": " << List(s.ratios) << ", \"comm\": [";
  for (size_t i = 0; i < s.comms.size(); ++i) o << (i ? ", " : "") << Str(CommName(s.comms[i]));
  o << "], \"modes\": [";
  for (size_t i = 0; i < s.modes.size(); ++i) o << (i ? ", " : "") << Str(ModeName(s.modes[i]));
  o << "]},\n \"calibration\": {\"units\": " << r.calibration.units
    << ", \"compute_ms\": " << Num(r.calibration.measured_ms) << "},\n \"mps\": {\"available\": "
    << (r.mps_available ? "true" : "false") << ", \"reason\": " << Str(r.mps_reason)
    << "},\n \"points\": [\n  ";
  for (size_t i = 0; i < r.points.size(); ++i) o << (i ? ",\n  " : "") << PointJson(r.points[i]);
  o << "]}\n";
  return o.str();
}

std::string ReportMarkdown(const Report& r) {
  std::ostringstream o;
  o << "gpu_probe on " << (r.device.empty() ? "?" : r.device)
    << (r.stand_in ? " (CPU stand-in: NOT GPU numbers)" : "") << ": " << r.settings.procs
    << " processes, C = " << Num(r.calibration.measured_ms) << " ms alone, "
    << r.settings.trials << " interleaved trials; ratios of aggregate steps/s, median [min-max]"
    << (r.mps_available ? "" : "; mps: " + r.mps_reason) << ".\n\n"
    << "| M/C | comm | naive/solo | crossover/solo | mps/solo | crossover/naive | busy naive "
       "| busy crossover | hand-off us |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const Point& p : r.points) {
    o << "| " << Num(p.ratio) << " | " << CommName(p.comm) << " | "
      << Cell(RatioValues(p, Mode::kNaive, Mode::kSolo), "%.2f") << " | "
      << Cell(RatioValues(p, Mode::kCrossover, Mode::kSolo), "%.2f") << " | "
      << Cell(RatioValues(p, Mode::kMps, Mode::kSolo), "%.2f") << " | "
      << Cell(RatioValues(p, Mode::kCrossover, Mode::kNaive), "%.2f") << " | "
      << Cell(Collect(p, Mode::kNaive, [](const SessionResult& s) { return s.busy_fraction; }), "%.2f")
      << " | "
      << Cell(Collect(p, Mode::kCrossover, [](const SessionResult& s) { return s.busy_fraction; }), "%.2f")
      << " | " << Cell(Handoffs(p), "%.0f") << " |\n";
  }
  return o.str();
}

bool WriteFile(const std::string& path, const std::string& text) {
  FILE* f = fopen(path.c_str(), "w");
  if (!f) return false;
  const bool ok = fwrite(text.data(), 1, text.size(), f) == text.size();
  return fclose(f) == 0 && ok;
}

}  // namespace gpu_probe
