// See gpu_probe_summary.h.
#include "gpu_probe/gpu_probe_summary.h"

#include <algorithm>

namespace gpu_probe {
namespace {

void SortByStart(std::vector<Phase>* phases) {
  std::sort(phases->begin(), phases->end(),
            [](const Phase& a, const Phase& b) { return a.span.start_ns < b.span.start_ns; });
}

}  // namespace

Summary Summarise(std::vector<double> values) {
  Summary s;
  s.n = static_cast<int>(values.size());
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  s.median = values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
  s.min = values.front();
  s.max = values.back();
  return s;
}

double StepsPerS(const WorkerRecord& record, int64_t t0, int64_t t1) {
  int64_t first = -1, last = -1, steps = 0;
  for (int64_t k = 0; k < record.n_spans && k < kMaxSpans; ++k) {
    if (record.step_begin_ns[k] < t0 || record.step_end_ns[k] > t1) continue;
    if (first < 0) first = record.step_begin_ns[k];
    last = record.step_end_ns[k];
    ++steps;
  }
  if (steps == 0 || last <= first) return 0;
  return steps / ((last - first) / 1e9);
}

std::vector<Phase> PhasesIn(const SessionShared& shared, int procs, int64_t t0, int64_t t1) {
  std::vector<Phase> phases;
  for (int p = 0; p < procs; ++p) {
    const WorkerRecord& r = shared.workers[p];
    for (int64_t k = 0; k < r.n_spans && k < kMaxSpans; ++k) {
      if (r.spans[k].end_ns >= t0 && r.spans[k].start_ns <= t1) phases.push_back({p, r.spans[k]});
    }
  }
  return phases;
}

double BusyFraction(std::vector<Phase> phases, int64_t t0, int64_t t1) {
  if (t1 <= t0) return 0;
  SortByStart(&phases);
  int64_t busy = 0, covered_to = t0;
  for (const Phase& ph : phases) {
    const int64_t start = std::max(ph.span.start_ns, covered_to);
    const int64_t end = std::min(ph.span.end_ns, t1);
    if (end > start) busy += end - start;
    covered_to = std::max(covered_to, std::min(ph.span.end_ns, t1));
  }
  return static_cast<double>(busy) / (t1 - t0);
}

std::vector<double> HandoffUs(std::vector<Phase> phases) {
  SortByStart(&phases);
  std::vector<double> gaps;
  for (size_t i = 1; i < phases.size(); ++i) {
    const Phase& prev = phases[i - 1];
    const Phase& next = phases[i];
    if (next.proc != prev.proc && next.span.request_ns < prev.span.end_ns &&
        next.span.start_ns >= prev.span.end_ns) {
      gaps.push_back((next.span.start_ns - prev.span.end_ns) / 1e3);
    }
  }
  return gaps;
}

int Overlaps(std::vector<Phase> phases) {
  SortByStart(&phases);
  int overlaps = 0;
  // Sorted by start, a phase can only intersect the phases before it that end after it starts;
  // the running latest end per process finds them in one pass.
  int64_t latest_end[kMaxProcs];
  std::fill(latest_end, latest_end + kMaxProcs, INT64_MIN);
  for (const Phase& ph : phases) {
    for (int p = 0; p < kMaxProcs; ++p) {
      if (p != ph.proc && latest_end[p] > ph.span.start_ns) ++overlaps;
    }
    latest_end[ph.proc] = std::max(latest_end[ph.proc], ph.span.end_ns);
  }
  return overlaps;
}

}  // namespace gpu_probe
