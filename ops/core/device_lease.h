// Cross-process device lease: lets training jobs on one host take the device one at a time.
//
// The lease lives in a segment file "<dir>/crossover.<group>.<device_key>", mapped shared, so
// every process on the host that names the same directory, group and device shares it. The
// directory is /dev/shm unless the caller names another (SegmentLocation::dir): containers and
// Slurm's job_container/tmpfs give each job its own /dev/shm, so jobs that must share a device
// share a directory instead. It must be on a local file system of the host: a network (or
// FUSE) file system is refused, since the futex and the file locks do not work across hosts.
// It is plain C++ (no TensorFlow), so it can be tested on its own (testing/device_lease_test.cc,
// testing/lease_cli.cc); tf/lease_kernels.cc wraps it in the TF ops that tf/lease_ops.cc
// registers. Nothing in core/ includes anything outside core/ (ops/README.md).
//
// The same segment also keeps the jobs' link turn (link_turn.h): the order in which the jobs of
// the group run their gradient allreduces. Which file of core/ keeps which part:
//   lease_segment.{h,cc}   the segment: its layout, its mutex, and this process's membership
//                          (one per segment, shared by both users)
//   lease_segment_file.cc  opening, creating, checking and replacing the segment file
//   lease_dir.{h,cc}       the lease directory's trust rule and its link-safe walk
//   segment_fault.{h,cc}   naming a truncated segment when its mapping faults (SIGBUS)
//   lease_liveness.{h,cc}  slots, their open-file-description locks, identities, job labels
//   waiter_queue.{h,cc}    the FIFO of threads waiting for the device
//   lease_registry.{h,cc}  the process-wide registry of open segments, and fork() handling
//   device_lease.{h,cc}    this class;  link_turn.{h,cc}  the link turn
//
// Guarantees, and how each is kept (the segment's own, one segment per name, layouts, file
// systems and users, are listed in lease_segment.h; liveness across PID namespaces in
// lease_liveness.h):
//  * Mutual exclusion: the state is guarded by a robust process-shared mutex, and the holder is
//    recorded by an identity that no other process can share.
//  * FIFO hand-off: every waiting thread has its own ticket in a queue; a process that yields
//    and acquires again goes behind every waiting peer, so N contending jobs get the device in
//    rotation. A ticket expires at its waiter's deadline, so a waiter that could not even take
//    the internal lock to remove it leaves no ghost in the queue.
//  * Bounded waits: acquire has a timeout, and so does every wait for the internal mutex (a
//    process stopped inside it, e.g. Ctrl-Z, gives a clear error, not a hang).
//  * fork(): a child never inherits its parent's hold; it gets its own identity on first use.
//  * Membership: every process that opens the lease is a member, under its job's label kept in
//    its slot; Members() lists the live members from the mapping this process holds; Inspect()
//    lists them from a file without joining (read-only, non-blocking: no slot, no creation,
//    no repair, never the internal mutex).
#ifndef CROSSOVER_TF_OPS_CORE_DEVICE_LEASE_H_
#define CROSSOVER_TF_OPS_CORE_DEVICE_LEASE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/lease_types.h"

namespace crossover {

// Statistics of this process's use of one lease (cumulative since the lease was opened).
// kLeaseStatsFields names the fields in the order the stats op returns them.
struct LeaseStats {
  uint64_t acquires = 0;            // successful acquisitions (not counting re-entrant no-ops)
  uint64_t handoffs = 0;            // acquisitions where the previous holder was another process
  uint64_t contended = 0;           // acquisitions that had to wait behind a holder or waiter
  uint64_t recoveries = 0;          // dead holders/waiters or corrupt state repaired by us
  double wait_s = 0, hold_s = 0;    // total time waiting for / holding the lease
  double max_wait_s = 0, max_hold_s = 0;
  bool held = false;                // this process holds the lease right now
  std::vector<double> Values() const;
};
extern const char* const kLeaseStatsFields[9];

// One acquire/yield cycle (a hold); wall-clock (CLOCK_REALTIME) nanoseconds so the timelines of two
// processes on the same host line up.
struct LeaseEvent {
  int64_t request_ns = 0, acquired_ns = 0, yielded_ns = 0;  // yielded_ns == 0: still held
  int64_t tag = 0;                                           // caller's label (e.g. phase)
  std::array<int64_t, 4> Row() const { return {request_ns, acquired_ns, yielded_ns, tag}; }
};

// Who is on a lease, as Inspect() saw it at one moment.
struct LeaseMember {
  std::string job;
  int32_t pid = 0;
  uint64_t pid_ns = 0;
  bool holding = false;
  LeaseUsage usage;  // its counters; hold_ns includes its current hold
};
struct LeaseWaiter {  // one waiting thread, in queue order
  std::string job;
  int32_t pid = 0;
  uint64_t pid_ns = 0;
  int32_t priority = kNormal;
  int64_t since_wall_ns = 0;
};
struct LeaseSnapshot {
  std::vector<LeaseMember> members;  // live slots
  std::vector<LeaseWaiter> queue;
  int64_t held_since_wall_ns = 0;    // 0: free
  int64_t held_for_ns = 0;           // the current hold so far (host CLOCK_MONOTONIC)
  uint64_t overlapping_holds = 0;    // SharedLease::inside's count: must be 0
  uint64_t handoffs = 0, recoveries = 0;  // the lease's totals, all members together
};

class LeaseSegment;
class SegmentLock;
struct Owner;
template <typename Event>
class EventRing;

class DeviceLease {
 public:
  // Returns the process-wide lease for (group, device_key), opening or creating the segment.
  // Names may use [A-Za-z0-9_-], group up to kMaxGroupLen chars, device_key up to
  // kMaxDeviceKeyLen.
  // The process-wide registry keys segments by path (location.dir resolved, so every spelling
  // of one directory is one lease); a segment open already keeps the ownership rule it was
  // opened with. A process is one job: opening a segment it has open already under another
  // explicit job label is an error (the default label gives way to the first explicit one).
  static LeaseStatus Get(const std::string& group, const std::string& device_key,
                         std::shared_ptr<DeviceLease>* out,
                         const SegmentLocation& location = SegmentLocation());
  static LeaseStatus ValidateName(const std::string& group, const std::string& device_key);
  static LeaseStatus ValidateJob(const std::string& job);  // "" (the default label) is valid
  // The segment file of (dir, group, device_key), dir checked as Get() checks it.
  static LeaseStatus SegmentPath(const std::string& dir, const std::string& group,
                                 const std::string& device_key, std::string* path);
  // Reads who is on the segment file at path without becoming a member: it never creates,
  // claims a slot, repairs or blocks (lease_segment.h's ReadSegment); bound_s bounds the
  // retries for a consistent copy.
  static LeaseStatus Inspect(const std::string& path, double bound_s, LeaseSnapshot* out);
  static LeaseStatus ValidateTimeout(double timeout_s);
  static LeaseStatus ValidatePriority(int64_t priority);
  static LeaseStatus ValidateReserve(double reserve_s);

  // Blocks until this process holds the lease, or timeout_s elapses (kDeadlineExceeded).
  // Holding it already is a no-op. priority is a LeasePriority.
  LeaseStatus Acquire(double timeout_s, int64_t tag, int32_t priority = kNormal);
  // Yields the lease (hands the device back) if this process holds it (a no-op otherwise). With reserve_s > 0,
  // waiters of a lower priority class than this process's last acquire cannot take the lease
  // for that long (or until this process acquires again, or dies): a primary yielding at the
  // end of a step keeps a secondary from starting new work it would then have to wait for.
  // Fails only if the internal lock stays taken by another process (stopped or wedged).
  LeaseStatus Yield(double reserve_s = 0);
  // Runs drain (e.g. wait for the device's stream), then yields whatever drain returned:
  // the lease is given up on every path and drain's error is the one reported.
  LeaseStatus YieldAfter(const std::function<LeaseStatus()>& drain, double reserve_s = 0);

  // Claims this process's slot (membership) if it has none; Get() already does, so this only
  // matters after fork(). Idempotent.
  LeaseStatus Register();
  // Who is on the lease, read from the segment this process has mapped (never a file looked
  // up again by name; an error if the name no longer refers to it): the join check's source.
  LeaseStatus Members(LeaseSnapshot* out);

  LeaseStats Stats() const;
  std::vector<LeaseEvent> Timeline() const;
  const std::string& name() const;
  const std::string& path() const;

  DeviceLease(const DeviceLease&) = delete;
  DeviceLease& operator=(const DeviceLease&) = delete;
  ~DeviceLease();

 private:
  friend class LeaseRegistry;
  friend struct LeaseTestHooks;
  explicit DeviceLease(std::shared_ptr<LeaseSegment> segment);

  // Returns with the internal mutex held once this thread may take the lease: it is free and
  // nobody is ahead of it in the waiter queue.
  LeaseStatus WaitInQueue(SegmentLock* locked, const Owner& me, int32_t priority,
                          int64_t deadline, double timeout_s, bool* contended, bool* reentrant);
  bool ReservedAgainst(const Owner& me, int32_t priority) const;
  LeaseStatus TimeoutError(double timeout_s, const Owner& me) const;
  void RecordAcquired(int64_t request_wall, int64_t acquired_wall, int64_t start_mono,
                      bool handoff, bool contended, int64_t tag, int32_t priority);
  void RecordYielded(int64_t yielded_wall, int64_t yielded_mono);
  // For the registry's fork handlers: local state is held across fork(); a child holds
  // nothing.
  void LockForFork() { local_mu_.lock(); }
  void UnlockAfterFork(bool child);

  const std::shared_ptr<LeaseSegment> segment_;
  mutable std::mutex local_mu_;  // guards what follows; never held while waiting for the lease
  LeaseStats stats_;
  std::unique_ptr<EventRing<LeaseEvent>> events_;
  int64_t held_since_mono_ns_ = 0;
  int32_t held_priority_ = kNormal;  // the class of this process's current or last hold
};

}  // namespace crossover

#endif  // CROSSOVER_TF_OPS_CORE_DEVICE_LEASE_H_
