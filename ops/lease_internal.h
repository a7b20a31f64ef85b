// Small helpers every file of the lease core uses: clocks, errno messages, warnings. Private
// to the core (never included by the op kernels or the tools).
#ifndef CROSSOVER_TF_OPS_LEASE_INTERNAL_H_
#define CROSSOVER_TF_OPS_LEASE_INTERNAL_H_

#include <errno.h>
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "lease_types.h"

namespace crossover {

constexpr int64_t kNsPerS = 1000000000;

inline int64_t NowNs(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return int64_t{ts.tv_sec} * kNsPerS + ts.tv_nsec;
}
// CLOCK_MONOTONIC: one clock for every process of the host, used for deadlines.
inline int64_t MonoNs() { return NowNs(CLOCK_MONOTONIC); }
// CLOCK_REALTIME: for timelines, so that two processes' events line up.
inline int64_t WallNs() { return NowNs(CLOCK_REALTIME); }
inline timespec ToTimespec(int64_t ns) {
  return timespec{static_cast<time_t>(ns / kNsPerS), static_cast<long>(ns % kNsPerS)};
}

inline std::string Errno(const std::string& what) { return what + ": " + strerror(errno); }
inline LeaseStatus Internal(const std::string& what) {
  return LeaseStatus::Error(LeaseCode::kInternal, Errno(what));
}

inline void EmitWarning(const std::string& msg) {
  fprintf(stderr, "[crossover lease] %s\n", msg.c_str());
}

}  // namespace crossover

#endif  // CROSSOVER_TF_OPS_LEASE_INTERNAL_H_
