// Cross-process device lease: lets two training jobs on one host take turns on one device.
//
// The lease lives in a POSIX shared-memory segment named "/crossover.<group>.<device_key>" so
// every process on the host that names the same group and device shares it. It is plain C++
// (no TensorFlow), so it can be tested and reasoned about on its own; lease_ops.cc wraps it in
// TF ops.
//
// Guarantees:
//  * mutual exclusion between processes (a process-shared robust mutex guards the state);
//  * FIFO hand-off: a process that releases and immediately re-acquires queues behind a peer
//    that is already waiting, so two contending jobs alternate;
//  * a dead holder or waiter (SIGKILL, crash) never blocks the others: liveness is checked
//    against /proc (pid + start time, so a recycled pid is not mistaken for the holder);
//  * acquire has a timeout and reports the group and the holder's pid;
//  * a stale or corrupt segment left by a crashed run is repaired or recreated, never reused
//    blindly.
#ifndef CROSSOVER_TF_OPS_DEVICE_LEASE_H_
#define CROSSOVER_TF_OPS_DEVICE_LEASE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace crossover {

enum class LeaseCode { kOk, kInvalidArgument, kDeadlineExceeded, kResourceExhausted, kInternal };

struct LeaseStatus {
  LeaseCode code = LeaseCode::kOk;
  std::string message;
  bool ok() const { return code == LeaseCode::kOk; }
  static LeaseStatus Ok() { return {}; }
  static LeaseStatus Error(LeaseCode code, std::string message) { return {code, std::move(message)}; }
};

// Statistics of this process's use of one lease (cumulative since the lease was opened).
struct LeaseStats {
  uint64_t acquires = 0;            // successful acquisitions (not counting re-entrant no-ops)
  uint64_t handoffs = 0;            // acquisitions where the previous holder was another process
  uint64_t contended = 0;           // acquisitions that had to wait behind a holder or waiter
  uint64_t recoveries = 0;          // dead holders/waiters or corrupt state repaired by us
  double wait_s = 0, hold_s = 0;    // total time waiting for / holding the lease
  double max_wait_s = 0, max_hold_s = 0;
  bool held = false;                // this process holds the lease right now
};

// One acquire/release cycle; wall-clock (CLOCK_REALTIME) nanoseconds so the timelines of two
// processes on the same host line up.
struct LeaseEvent {
  int64_t request_ns = 0, acquired_ns = 0, released_ns = 0;  // released_ns == 0: still held
  int64_t tag = 0;                                           // caller's label (e.g. phase)
};

struct SharedLease;  // layout in shared memory; defined in device_lease.cc

class DeviceLease {
 public:
  // Returns the process-wide lease for (group, device_key), opening or creating the segment.
  // Names may use [A-Za-z0-9_-], group up to 64 chars, device_key up to 32.
  static LeaseStatus Get(const std::string& group, const std::string& device_key,
                         std::shared_ptr<DeviceLease>* out);

  // Blocks until this process holds the lease, or timeout_s elapses (kDeadlineExceeded).
  // Holding it already is a no-op.
  LeaseStatus Acquire(double timeout_s, int64_t tag);
  // Releases the lease if this process holds it; returns whether it did.
  bool Release();

  LeaseStats Stats() const;
  std::vector<LeaseEvent> Timeline() const;
  const std::string& name() const { return name_; }

  // Removes the segment name (processes that have it mapped keep working). For launchers.
  static LeaseStatus Unlink(const std::string& group, const std::string& device_key);
  static LeaseStatus ValidateName(const std::string& group, const std::string& device_key);

  DeviceLease(const DeviceLease&) = delete;
  DeviceLease& operator=(const DeviceLease&) = delete;
  ~DeviceLease();

 private:
  DeviceLease(std::string name, SharedLease* shared);
  // Takes the shared mutex, repairing state a crashed process left. check_liveness also drops
  // a dead holder and dead waiters (reads /proc, so the uncontended fast path skips it).
  LeaseStatus Lock(bool check_liveness);
  void Unlock();
  void RepairLocked(bool check_liveness);

  const std::string name_;
  SharedLease* const shared_;
  mutable std::mutex local_mu_;  // serialises this process's threads and guards stats_/events_
  LeaseStats stats_;
  std::vector<LeaseEvent> events_;  // ring buffer
  size_t next_event_ = 0;
  int64_t held_since_mono_ns_ = 0;
};

}  // namespace crossover

#endif  // CROSSOVER_TF_OPS_DEVICE_LEASE_H_
