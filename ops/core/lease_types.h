// What callers of the lease core pass in and get back, shared by the device lease
// (device_lease.h) and the link turn (link_turn.h): status codes, limits, priority classes and
// where a segment lives. Plain C++, no TensorFlow.
#ifndef CROSSOVER_TF_OPS_CORE_LEASE_TYPES_H_
#define CROSSOVER_TF_OPS_CORE_LEASE_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace crossover {

enum class LeaseCode {
  kOk,
  kInvalidArgument,
  kDeadlineExceeded,
  kResourceExhausted,
  kPermissionDenied,
  kFailedPrecondition,  // the segment a job holds is no longer the one its name refers to
  kInternal,
};

struct LeaseStatus {
  LeaseCode code = LeaseCode::kOk;
  std::string message;
  bool ok() const { return code == LeaseCode::kOk; }
  static LeaseStatus Ok() { return {}; }
  static LeaseStatus Error(LeaseCode code, std::string message) { return {code, std::move(message)}; }
};

// Limits, one source for C++ (the Python side mirrors the name limits in segments.py).
constexpr size_t kMaxGroupLen = 64;
constexpr size_t kMaxDeviceKeyLen = 32;
constexpr size_t kMaxJobLen = 64;   // a member's job label: [A-Za-z0-9_.:@-]
constexpr const char* kDefaultLeaseDir = "/dev/shm";
constexpr int kMaxWaiters = 64;     // waiting threads, all processes together
constexpr int kMaxProcesses = 64;   // processes that have one lease open at once
constexpr double kMaxTimeoutS = 30.0 * 24 * 3600;  // acquire timeouts above this are refused
constexpr double kMaxReserveS = 10.0;              // longest reservation a yield may leave
constexpr int kMaxLinkTurnJobs = 8;                // jobs of one group that take link turns

// Priority classes. Waiters queue by class, FIFO within one: peers of one class go in order;
// a primary never queues behind a secondary.
enum LeasePriority : int32_t { kSecondary = 0, kNormal = 1, kPrimary = 2 };

// Upper bounds of the acquire-wait histogram's buckets (the last bucket counts the rest). The
// exporter serves them as seconds (crossover_tf/node/exporter_metrics.py: WAIT_BUCKETS_S).
constexpr int kWaitBuckets = 8;
constexpr int64_t kWaitBucketUpperNs[kWaitBuckets - 1] = {
    100000, 1000000, 10000000, 100000000, 1000000000, 10000000000, 60000000000};

// What one member did with a lease since it joined, kept in the segment (one per slot, zeroed
// when a process claims the slot) so that an observer can read it without asking the member:
// the exporter's per-job counters. Cumulative and never decreasing while the member lives.
struct LeaseUsage {
  uint64_t acquires = 0;
  uint64_t contended = 0;     // acquisitions that had to wait behind a holder or a waiter
  uint64_t handoffs = 0;      // acquisitions that took over from another process
  int64_t hold_ns = 0;        // finished holds (an observer adds the current one)
  int64_t wait_ns = 0;        // from asking to holding, every acquisition
  uint64_t wait_buckets[kWaitBuckets] = {};  // acquisitions by wait (kWaitBucketUpperNs)
  uint64_t link_turns = 0;    // link turns taken
  uint64_t link_turn_waits = 0;  // ... of which waited for another job
  int64_t link_turn_wait_ns = 0;
};

// Where a segment lives and who this process is on it (DeviceLease::Get, LinkTurn::Get). Not
// the Python crossover_tf.LeaseOptions (jobs, timeouts, priority): the op attributes lease_dir,
// shared_group and job carry these three fields to the kernels (tf/lease_kernels.cc).
struct SegmentLocation {
  std::string dir;            // "": kDefaultLeaseDir; must exist, on a local file system
  bool shared_group = false;  // several users: segments 0660, of the directory's group
  std::string job;            // this process's job label; "": "<host>:<pid>"
};

}  // namespace crossover

#endif  // CROSSOVER_TF_OPS_CORE_LEASE_TYPES_H_
