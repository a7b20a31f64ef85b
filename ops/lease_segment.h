// The shared-memory segment that the device lease (device_lease.h) and the link turn
// (link_turn.h) both live in: its layout, how it is opened, created, checked and replaced, the
// robust mutex that guards it, and this process's membership on it (its slot). Private to the
// core: the op kernels and tools see only DeviceLease and LinkTurn.
//
// Guarantees kept here:
//  * Mutual exclusion of every update: the state is guarded by a robust process-shared mutex
//    (SegmentLock), whose every take is bounded (a process stopped inside it, e.g. Ctrl-Z,
//    gives a clear error, not a hang) and drops whatever dead processes left behind.
//  * One segment per name: creating, validating and replacing a segment happen under flock() on
//    the segment's inode, and a stale segment is unlinked only after checking that the name
//    still refers to the inode we locked. Two starters can never end up on different segments.
//  * Builds of another segment layout on the same device (jobs of two versions): the layout
//    version sits in a fixed header, and a segment of another layout is replaced only when no
//    process holds a lock on any byte of it; while one does, opening fails naming both layouts.
//  * A local file system: a lease directory on a network (or FUSE) file system is refused,
//    since the futex and the file locks do not work across hosts.
//  * Several users (LeaseOptions::shared_group): segment files are 0660 and belong to the
//    directory's group; a segment of another group or with other bits is refused, never
//    deleted (without group mode: a segment not ours or not 0600, likewise).
//  * Membership: every process that opens the segment is a member, under its job's label kept
//    in its slot (lease_liveness.h); fork(): a child never inherits its parent's identity, it
//    claims its own on first use.
#ifndef CROSSOVER_TF_OPS_LEASE_SEGMENT_H_
#define CROSSOVER_TF_OPS_LEASE_SEGMENT_H_

#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lease_internal.h"
#include "lease_liveness.h"
#include "lease_types.h"
#include "waiter_queue.h"

namespace crossover {

constexpr int64_t kPollNs = 20 * 1000 * 1000;  // liveness re-check period while waiting
// Bounds every take of the internal mutex except Acquire's (which waits until its own
// timeout): Release, slot claims and job labels, and every link turn operation. A process
// stopped or wedged inside the mutex then turns into an error after this long, never a hang.
constexpr int64_t kInternalLockBoundNs = 10 * kNsPerS;
constexpr int64_t kLockGraceNs = 200 * 1000 * 1000;  // internal-lock wait past a passed deadline

// One job's place in the link turn order on this host (see LinkTurn).
enum LinkTurnState : int32_t { kLinkTurnFree = 0, kLinkTurnJoining = 1, kLinkTurnActive = 2 };
struct LinkTurnEntry {
  Owner who;        // the process of this host that runs the job's allreduces
  int32_t state;    // LinkTurnState
  int32_t jobs;     // how many jobs the group has, as this job was told
  int64_t offset;   // global index of the job's first turn
  int64_t done;     // turns finished here; the next one is offset + done
};

// The first bytes of every segment, whatever its layout version (see kLayoutVersion in
// lease_segment_file.cc).
struct SegmentHeader {
  std::atomic<uint64_t> magic;  // written last by the creator: the segment is initialised
  uint32_t layout_version;
  uint32_t struct_size;
};
static_assert(sizeof(SegmentHeader) == 16, "the header is fixed across layout versions");

// The segment's layout. Any change below the header must bump kLayoutVersion.
struct SharedLease {
  SegmentHeader header;  // first: at offset 0 in every layout
#ifdef CROSSOVER_LEASE_TEST_LAYOUT_PAD
  char test_pad[CROSSOVER_LEASE_TEST_LAYOUT_PAD];
#endif
  pthread_mutex_t mu;              // robust, process-shared
  std::atomic<uint32_t> wake_seq;  // futex word: bumped on every release and repair
  std::atomic<int32_t> locker_pid; // who took mu last (for the "stuck inside" message)
  // Guarded by mu.
  Owner holder;                    // empty: free
  int64_t held_since_wall_ns;
  Owner last_holder;
  Owner reserved_for;              // see DeviceLease::Release(reserve_s)
  int64_t reserved_until_mono_ns;
  int32_t reserved_priority;
  uint64_t next_ticket;
  WaiterQueue queue;
  Slot slots[kMaxProcesses];
  uint64_t total_handoffs;
  uint64_t total_recoveries;
  LinkTurnEntry link_turns[kMaxLinkTurnJobs];  // indexed by position
};

// Wakes every thread waiting on the segment's futex word (bumping it first).
void WakeAll(SharedLease* s);
// Wakes them without bumping (the caller bumped it under the mutex).
void WakeWaiters(SharedLease* s);

// A segment file and how it must be owned.
struct SegmentFile {
  std::string dir, path;
  bool shared_group = false;
  gid_t dir_gid = 0;
};

// "/crossover.<group>.<device_key>": the lease's name, and its segment file in the directory.
std::string SegmentName(const std::string& group, const std::string& device_key);
// Checks the lease directory (it exists, is a directory, on a local file system) and names
// the segment file in it. dir "" is kDefaultLeaseDir.
LeaseStatus ResolveSegmentFile(const std::string& dir, const std::string& name,
                               bool shared_group, SegmentFile* out);
// Opens the segment file, creating it if missing and replacing it if it is stale or of another
// layout while nobody uses it; on success *fd_out holds the presence lock and *shared_out the
// mapping. What it replaced goes to warnings.
LeaseStatus OpenSegment(const SegmentFile& file, int* fd_out, SharedLease** shared_out,
                        std::vector<std::string>* warnings);
// Runs read on the segment file at path like a member would, minus everything that makes one:
// a fresh open file description (no presence or slot lock, so it counts for nobody), no
// creation, no repair, the mutex waited for at most bound_s and held while read runs.
LeaseStatus ReadSegment(const std::string& path, double bound_s,
                        const std::function<void(int fd, const SharedLease& s)>& read);

// One mapped segment and this process's membership on it; the device lease and the link turn
// of one (dir, group, device_key) share it (LeaseRegistry hands it out).
class LeaseSegment {
 public:
  // Opens, creates or replaces the segment file and claims this process's slot; what it
  // replaced goes to warnings, for the caller to write once it holds no lock.
  static LeaseStatus Open(const SegmentFile& file, const std::string& name,
                          const std::string& job, std::shared_ptr<LeaseSegment>* out,
                          std::vector<std::string>* warnings);

  const std::string& name() const { return name_; }
  const std::string& path() const { return path_; }
  SharedLease* shared() const { return shared_; }
  // This process's identity, claimed on first use and again after fork().
  LeaseStatus Identity(Owner* me);
  // A process is one job: a segment opened with the default label takes the first explicit
  // one (rewriting its slot's label), and a second, different explicit label is an error.
  LeaseStatus AdoptJob(const std::string& job);
  bool Alive(const Owner& o) const;
  void CountRecoveries(int repaired);
  uint64_t recoveries() const { return recoveries_.load(); }

  // For the registry's fork handlers only: hold the identity across fork(); in the child,
  // forget it (the child claims its own on first use) before letting go.
  void LockForFork() { identity_mu_.lock(); }
  void UnlockAfterFork(bool child);

  LeaseSegment(const LeaseSegment&) = delete;
  LeaseSegment& operator=(const LeaseSegment&) = delete;
  ~LeaseSegment();

 private:
  LeaseSegment(std::string name, std::string path, std::string job, int fd, SharedLease* shared);
  LeaseStatus ClaimSlotLocked();

  const std::string name_;
  const std::string path_;
  SharedLease* const shared_;
  std::atomic<uint64_t> my_nonce_{0};    // read lock-free by liveness checks
  std::atomic<uint64_t> recoveries_{0};  // repairs this process made
  std::mutex identity_mu_;  // guards what follows; never taken inside the shared mutex
  int lock_fd_;             // the segment, O_CLOEXEC; carries this process's slot lock
  pid_t identity_pid_ = 0;  // the process that claimed me_ (differs after fork)
  std::string job_;         // explicit job label; "": "<host>:<pid>" at each claim
  Owner me_;
};

// Holds the segment's shared mutex for one critical section. On every lock it drops a dead
// holder, dead or duplicate waiters and dead link turn entries, so no path acts on stale
// state. Warnings are written only after unlocking: a blocked stderr must never stall every
// job on the device.
class SegmentLock {
 public:
  explicit SegmentLock(LeaseSegment* segment) : segment_(segment), s_(segment->shared()) {}
  ~SegmentLock() { Unlock(); }
  SegmentLock(const SegmentLock&) = delete;
  SegmentLock& operator=(const SegmentLock&) = delete;

  // Fails (kDeadlineExceeded) if the mutex stays taken past deadline_mono (plus a grace).
  LeaseStatus Lock(int64_t deadline_mono);
  void Unlock();
  // Lets go, sleeps until the segment changes (WakeAll) or for min(remaining_ns, kPollNs),
  // then locks again by relock_deadline (0: kInternalLockBoundNs after waking).
  LeaseStatus AwaitChange(int64_t remaining_ns, int64_t relock_deadline = 0);
  void Warn(std::string msg) { warnings_.push_back(std::move(msg)); }

 private:
  void DropDead();

  LeaseSegment* const segment_;
  SharedLease* const s_;
  bool locked_ = false;
  std::vector<std::string> warnings_;
};

// For tests only (lease_test_hooks.h): segment creation pauses this long between sizing and
// initialising the segment.
void SetSegmentInitDelayMs(int ms);

}  // namespace crossover

#endif  // CROSSOVER_TF_OPS_LEASE_SEGMENT_H_
