// Arithmetic over one session's recorded spans (gpu_probe_worker.h), kept apart from processes
// and I/O: steps/s in the counting window, device busy time, lease hand-offs and overlaps, and
// the median [min-max] summaries every ratio is reported as.
#ifndef CROSSOVER_TF_OPS_GPU_PROBE_GPU_PROBE_SUMMARY_H_
#define CROSSOVER_TF_OPS_GPU_PROBE_GPU_PROBE_SUMMARY_H_

#include <cstdint>
#include <vector>

#include "gpu_probe/gpu_probe_worker.h"

namespace gpu_probe {

struct Summary {
  double median = 0, min = 0, max = 0;
  int n = 0;
};
Summary Summarise(std::vector<double> values);  // n == 0 for an empty list

// Steps/s of one process: steps that began at or after t0 and ended by t1, over the time from
// the first such step's beginning to the last one's end (0 if fewer than one such step).
double StepsPerS(const WorkerRecord& record, int64_t t0, int64_t t1);

// A compute phase of one process, for the cross-process measures below.
struct Phase {
  int proc;
  Span span;
};
std::vector<Phase> PhasesIn(const SessionShared& shared, int procs, int64_t t0, int64_t t1);

// Share of [t0, t1] during which at least one process was in a compute phase.
double BusyFraction(std::vector<Phase> phases, int64_t t0, int64_t t1);

// Hand-offs between processes: a phase that began after another process's phase ended while it
// was already waiting (its request came before that end). Gap in microseconds.
std::vector<double> HandoffUs(std::vector<Phase> phases);

// Pairs of phases of different processes whose [start, end] spans intersect; under the lease
// this must be 0.
int Overlaps(std::vector<Phase> phases);

}  // namespace gpu_probe

#endif  // CROSSOVER_TF_OPS_GPU_PROBE_GPU_PROBE_SUMMARY_H_
