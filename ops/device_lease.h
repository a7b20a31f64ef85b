// Cross-process device lease: lets training jobs on one host take turns on one device.
//
// The lease lives in a segment file "<dir>/crossover.<group>.<device_key>", mapped shared, so
// every process on the host that names the same directory, group and device shares it. The
// directory is /dev/shm unless the caller names another (LeaseOptions::dir): containers and
// Slurm's job_container/tmpfs give each job its own /dev/shm, so jobs that must take turns
// share a directory instead. It must be on a local file system of the host: a network (or
// FUSE) file system is refused, since the futex and the file locks below do not work across
// hosts. It is plain C++
// (no TensorFlow), so it can be tested on its own (device_lease_test.cc, lease_cli.cc);
// lease_ops.cc wraps it in TF ops.
//
// Guarantees, and how each is kept:
//  * Mutual exclusion: the state is guarded by a robust process-shared mutex, and the holder is
//    recorded by an identity that no other process can share.
//  * One segment per name: creating, validating and replacing a segment happen under flock() on
//    the segment's inode, and a stale segment is unlinked only after checking that the name
//    still refers to the inode we locked. Two starters can never end up on different segments.
//  * Builds of another segment layout on the same device (jobs of two versions): the layout
//    version sits in a fixed header, and a segment of another layout is replaced only when no
//    process holds a lock on any byte of it; while one does, opening fails naming both layouts.
//  * Liveness that holds across PID namespaces (containers with a shared /dev/shm): each
//    process owns a slot whose byte it locks with an open-file-description lock on the segment.
//    The kernel drops that lock when the process dies, whatever namespace either side is in, so
//    "dead" is never guessed from a pid that may belong to another namespace.
//  * FIFO hand-off: every waiting thread has its own ticket in a queue; a process that releases
//    and acquires again goes behind every waiting peer, so N contending jobs take turns. A
//    ticket expires at its waiter's deadline, so a waiter that could not even take the
//    internal lock to remove it leaves no ghost in the queue.
//  * Bounded waits: acquire has a timeout, and so does the wait for the internal mutex (a
//    process stopped inside it, e.g. Ctrl-Z, gives a clear error, not a hang).
//  * fork(): a child never inherits its parent's hold; it gets its own identity on first use.
//  * Membership: every process that opens the lease is a member, under its job's label kept in
//    its slot; Inspect() lists the live members, the holder and the queue without joining
//    (no slot, no creation, no repair, the internal mutex waited for with a bound).
//  * Several users (LeaseOptions::shared_group): segment files are 0660 and belong to the
//    directory's group; a segment of another group or with other bits is refused, never
//    deleted (without group mode: a segment not ours or not 0600, likewise).
//
// The same segment also keeps the jobs' *link turn*: the order in which the jobs of the group
// run their gradient allreduces, so that they use the network one at a time instead of
// partly overlapping (see TurnWait). It is a wait, never a hold: nothing is owned while a
// process is blocked in a collective, and the order is one global order on every host.
#ifndef CROSSOVER_TF_OPS_DEVICE_LEASE_H_
#define CROSSOVER_TF_OPS_DEVICE_LEASE_H_

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace crossover {

enum class LeaseCode {
  kOk,
  kInvalidArgument,
  kDeadlineExceeded,
  kResourceExhausted,
  kPermissionDenied,
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
constexpr int kMaxTurnJobs = 8;                    // jobs of one group that take link turns
constexpr int64_t kTurnUnconstrained = int64_t{1} << 62;  // TurnJoin with nobody turning

// Priority classes. Waiters queue by class, FIFO within one: peers of one class take turns;
// a primary never queues behind a secondary.
enum LeasePriority : int32_t { kSecondary = 0, kNormal = 1, kPrimary = 2 };

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

// Statistics of this process's link turns (cumulative since the lease was opened).
struct TurnStats {
  uint64_t turns = 0;        // turns taken (TurnWait calls that returned)
  uint64_t waited = 0;       // turns that had to wait for another job's allreduce
  uint64_t skipped = 0;      // turns taken without the predecessor done (wait bound passed)
  double wait_s = 0, max_wait_s = 0;
  std::vector<double> Values() const;
};
extern const char* const kTurnStatsFields[5];

// One acquire/release cycle; wall-clock (CLOCK_REALTIME) nanoseconds so the timelines of two
// processes on the same host line up.
struct LeaseEvent {
  int64_t request_ns = 0, acquired_ns = 0, released_ns = 0;  // released_ns == 0: still held
  int64_t tag = 0;                                           // caller's label (e.g. phase)
  std::array<int64_t, 4> Row() const { return {request_ns, acquired_ns, released_ns, tag}; }
};

// One link turn (wall-clock ns): asked for, begun (the wait is over), done (0: not yet).
struct TurnEvent {
  int64_t request_ns = 0, start_ns = 0, done_ns = 0;
  int64_t skipped = 0;  // 1: begun because the wait bound passed, not because it was our turn
  std::array<int64_t, 4> Row() const { return {request_ns, start_ns, done_ns, skipped}; }
};

// The newest `capacity` events of one kind, oldest first on read.
template <typename Event>
class EventRing {
 public:
  explicit EventRing(size_t capacity) : capacity_(capacity) {}
  void Push(const Event& e) {
    if (events_.size() < capacity_) {
      last_ = events_.size();
      events_.push_back(e);
    } else {
      last_ = next_;
      events_[last_] = e;
    }
    next_ = (last_ + 1) % capacity_;
  }
  Event* Last() { return events_.empty() ? nullptr : &events_[last_]; }
  std::vector<Event> Ordered() const {
    if (events_.size() < capacity_) return events_;
    std::vector<Event> ordered(events_.begin() + next_, events_.end());
    ordered.insert(ordered.end(), events_.begin(), events_.begin() + next_);
    return ordered;
  }

 private:
  size_t capacity_, next_ = 0, last_ = 0;
  std::vector<Event> events_;
};

// Who holds or waits: a slot (whose lock byte proves liveness) plus a nonce that makes the
// identity unique even after the slot is reused. pid and pid namespace are for messages only.
struct Owner {
  uint64_t nonce = 0;  // 0: nobody
  int32_t slot = -1;
  int32_t pid = 0;
  uint64_t pid_ns = 0;
  bool operator==(const Owner& o) const { return nonce == o.nonce; }
  bool empty() const { return nonce == 0; }
};

struct Waiter {
  Owner who;
  uint64_t ticket = 0;
  int64_t since_wall_ns = 0;
  int32_t priority = kNormal;
  // CLOCK_MONOTONIC (one clock for every process of the host) time at which the waiter gives
  // up. Past it the entry stands for nobody: its owner times out as soon as it runs again.
  int64_t deadline_mono_ns = 0;
};

// The FIFO of waiting threads. It lives in shared memory and may be left half-updated by a
// process that died inside the critical section, so Repair() must restore a valid queue from
// any contents.
struct WaiterQueue {
  int32_t size;
  Waiter entries[kMaxWaiters];

  bool Push(const Waiter& w);           // behind every waiter of its class or higher; false
                                        // when full
  bool Remove(uint64_t ticket);         // removes only that ticket; false if absent
  int Index(uint64_t ticket) const;     // -1 if absent
  // Clamps the size, drops entries of dead owners, duplicate tickets and entries whose
  // deadline is before now_mono_ns; returns how many entries it dropped.
  int Repair(const std::function<bool(const Owner&)>& alive, int64_t now_mono_ns);
};

struct SharedLease;  // layout in shared memory; defined in device_lease.cc

// The name of a file system type (statfs f_type) a lease directory must not be on, because
// the lease's futex and file locks do not work across hosts there; nullptr if it is local.
const char* NonLocalFileSystem(int64_t f_type);

// Where a lease's segment lives and who this process is on it (DeviceLease::Get).
struct LeaseOptions {
  std::string dir;            // "": kDefaultLeaseDir; must exist, on a local file system
  bool shared_group = false;  // several users: segments 0660, of the directory's group
  std::string job;            // this process's job label; "": "<host>:<pid>"
};

// Who is on a lease, as Inspect() saw it at one moment.
struct LeaseMember {
  std::string job;
  int32_t pid = 0;
  uint64_t pid_ns = 0;
  bool holding = false;
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
};

class DeviceLease {
 public:
  // Returns the process-wide lease for (group, device_key), opening or creating the segment.
  // Names may use [A-Za-z0-9_-], group up to kMaxGroupLen chars, device_key up to
  // kMaxDeviceKeyLen.
  // The process-wide registry keys leases by segment path (options.dir resolved, so every
  // spelling of one directory is one lease); a lease open already keeps the ownership rule it
  // was opened with. A process is one job: opening a lease it has open already under another
  // explicit job label is an error (the default label gives way to the first explicit one).
  static LeaseStatus Get(const std::string& group, const std::string& device_key,
                         std::shared_ptr<DeviceLease>* out,
                         const LeaseOptions& options = LeaseOptions());
  static LeaseStatus ValidateName(const std::string& group, const std::string& device_key);
  static LeaseStatus ValidateJob(const std::string& job);  // "" (the default label) is valid
  // The segment file of (dir, group, device_key), dir checked as Get() checks it.
  static LeaseStatus SegmentPath(const std::string& dir, const std::string& group,
                                 const std::string& device_key, std::string* path);
  // Reads who is on the segment file at path without becoming a member: it never creates,
  // claims a slot, or repairs, and waits for the internal mutex at most bound_s.
  static LeaseStatus Inspect(const std::string& path, double bound_s, LeaseSnapshot* out);
  static LeaseStatus ValidateTimeout(double timeout_s);
  static LeaseStatus ValidatePriority(int64_t priority);
  static LeaseStatus ValidateReserve(double reserve_s);
  static LeaseStatus ValidateTurn(int64_t position, int64_t jobs);

  // Blocks until this process holds the lease, or timeout_s elapses (kDeadlineExceeded).
  // Holding it already is a no-op. priority is a LeasePriority.
  LeaseStatus Acquire(double timeout_s, int64_t tag, int32_t priority = kNormal);
  // Releases the lease if this process holds it (a no-op otherwise). With reserve_s > 0,
  // waiters of a lower priority class than this process's last acquire cannot take the lease
  // for that long (or until this process acquires again, or dies): a primary yielding at the
  // end of a step keeps a secondary from starting new work it would then have to wait for.
  // Fails only if the internal lock stays taken by another process (stopped or wedged).
  LeaseStatus Release(double reserve_s = 0);
  // Runs drain (e.g. wait for the device's stream), then releases whatever drain returned:
  // the lease is given up on every path and drain's error is the one reported.
  LeaseStatus ReleaseAfter(const std::function<LeaseStatus()>& drain, double reserve_s = 0);

  // Link turns. Job `position` of `jobs` (the same numbering on every host) runs its allreduce
  // number k as global turn (offset + k, position), and the turns go in that order on every
  // host. Joining is two calls around an agreement among the job's own ranks:
  //   TurnJoin   registers this process at `position`; returns the latest turn index that
  //              puts this job's first turn before the next turn of every job already turning
  //              here (kTurnUnconstrained if none is);
  //   TurnStart  with the offset the job's ranks agreed on (the min of TurnJoin's, or 0 if
  //              that is kTurnUnconstrained).
  // A joining job thus goes first, and the jobs already turning wait at most for its first
  // allreduce, never the joiner for a peer that is momentarily not stepping (at a barrier,
  // say). Any offset is safe as long as all ranks of the job use the same one: the waits then
  // follow one total order and cannot form a cycle.
  LeaseStatus TurnJoin(int32_t position, int32_t jobs, int64_t* next_index);
  LeaseStatus TurnStart(int64_t offset);
  // Blocks until every earlier turn of the other jobs turning on this host is done, or for
  // wait_s at most (then *skipped: the order is only a schedule, never needed for
  // correctness, and a paused peer must not stall this job). A peer that died or left is
  // no longer waited for.
  LeaseStatus TurnWait(double wait_s, bool* skipped);
  LeaseStatus TurnDone();   // this process's current turn is over (its allreduce returned)
  LeaseStatus TurnLeave();  // stop turning (end of training); peers stop waiting for us
  TurnStats GetTurnStats() const;
  std::vector<TurnEvent> TurnTimeline() const;

  // Claims this process's slot (membership) if it has none; Get() already does, so this only
  // matters after fork(). Idempotent.
  LeaseStatus Register();

  LeaseStats Stats() const;
  std::vector<LeaseEvent> Timeline() const;
  const std::string& name() const { return name_; }
  const std::string& path() const { return path_; }

  DeviceLease(const DeviceLease&) = delete;
  DeviceLease& operator=(const DeviceLease&) = delete;
  ~DeviceLease();

 private:
  class Locked;
  friend struct LeaseTestHooks;
  friend struct ForkHandlers;
  DeviceLease(std::string name, std::string path, std::string job, int fd, SharedLease* shared);

  // This process's identity, claimed on first use and again after fork().
  LeaseStatus Identity(Owner* me);
  LeaseStatus ClaimSlotLocked();
  LeaseStatus AdoptJob(const std::string& job);
  void ForgetIdentityAfterForkLocked();
  bool Alive(const Owner& o) const;
  LeaseStatus WaitForTurn(Locked* locked, const Owner& me, int32_t priority, int64_t deadline,
                          double timeout_s, bool* contended, bool* reentrant);
  bool ReservedAgainst(const Owner& me, int32_t priority) const;
  LeaseStatus MyTurnEntry(Locked* locked, int32_t* position);
  int TurnBlocker(int32_t position) const;
  LeaseStatus TimeoutError(double timeout_s, const Owner& me) const;
  void RecordAcquired(int64_t request_wall, int64_t acquired_wall, int64_t start_mono,
                      bool handoff, bool contended, int64_t tag, int32_t priority);
  void RecordReleased(int64_t released_wall, int64_t released_mono);

  const std::string name_;
  const std::string path_;
  SharedLease* const shared_;
  std::atomic<uint64_t> my_nonce_{0};    // read lock-free by liveness checks
  std::atomic<uint64_t> recoveries_{0};  // repairs this process made
  mutable std::mutex local_mu_;  // guards what follows; never held while waiting for the lease
  int lock_fd_;                  // the segment, O_CLOEXEC; carries this process's slot lock
  pid_t identity_pid_ = 0;       // the process that claimed me_ (differs after fork)
  std::string job_;              // explicit job label; "": "<host>:<pid>" at each claim
  Owner me_;
  LeaseStats stats_;
  EventRing<LeaseEvent> events_;
  EventRing<TurnEvent> turn_events_;
  int64_t held_since_mono_ns_ = 0;
  int32_t held_priority_ = kNormal;  // the class of this process's current or last hold
  int32_t turn_position_ = -1;       // this process's link turn position, -1: not joined
  TurnStats turn_stats_;
};

// Hooks for device_lease_test.cc only: they let a test create the rare states (a process
// stopped or dead inside the critical section, a creator that stalls) that it must survive.
struct LeaseTestHooks {
  // Takes the lease's internal mutex and never releases it (the caller then stops or exits).
  static void LockInternal(DeviceLease& lease);
  // Makes segment creation pause this long between sizing and initialising the segment.
  static void SetInitDelayMs(int ms);
  static WaiterQueue& Queue(DeviceLease& lease);
};

}  // namespace crossover

#endif  // CROSSOVER_TF_OPS_DEVICE_LEASE_H_
