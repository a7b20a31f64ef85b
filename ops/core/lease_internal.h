// Small helpers every file of the lease core uses: clocks, errno messages, warnings. Private
// to the core (never included by the op kernels or the tools).
#ifndef CROSSOVER_TF_OPS_CORE_LEASE_INTERNAL_H_
#define CROSSOVER_TF_OPS_CORE_LEASE_INTERNAL_H_

#include <errno.h>
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/lease_types.h"

namespace crossover {

constexpr int64_t kNsPerS = 1000000000;

inline int64_t NowNs(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return int64_t{ts.tv_sec} * kNsPerS + ts.tv_nsec;
}
// CLOCK_MONOTONIC as this process reads it: for its own waits and bounds (the deadlines that
// pthread_mutex_clocklock and futex take are in it).
inline int64_t MonoNs() { return NowNs(CLOCK_MONOTONIC); }
// How far this process's time namespace moves CLOCK_MONOTONIC (/proc/self/timens_offsets; 0
// outside a time namespace). Read once: a process changes time namespace only at exec.
int64_t TimeNamespaceOffsetNs();
// CLOCK_MONOTONIC as the host reads it, whatever time namespace this process is in: the one
// clock every member of a lease reads alike. Every time a segment stores for other processes
// to compare (queue deadlines, reservations) is in it; a member in a time namespace would
// otherwise see a free device as reserved, or a peer's live ticket as expired.
inline int64_t HostMonoNs() { return MonoNs() - TimeNamespaceOffsetNs(); }
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

#endif  // CROSSOVER_TF_OPS_CORE_LEASE_INTERNAL_H_
