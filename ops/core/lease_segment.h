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
//  * A local file system: a lease directory must be on a file system known to be local (an
//    allowlist, lease_dir.h), since the futex and the file locks do not work across hosts.
//  * Trust (lease_dir.h): the directory, every directory above it and the segment file pass
//    the trust rule on every open, so no other user can rename, replace or plant a segment.
//    Several users (SegmentLocation::shared_group) share a lease in a directory of their group:
//    segment files are 0660 and belong to that group; any other file is refused, never
//    deleted (without group mode: a segment not ours or not 0600, likewise).
//  * Read what you hold: the join check and the member list read the mapping this process
//    holds, never a file looked up again by name, and every acquire checks that the name
//    still refers to it (CheckNamed): a segment renamed or replaced while in use is an error
//    for every member, not a silent second lease.
//  * Space before use: a fresh segment's blocks are allocated before it is mapped, so a full
//    directory is a clear error that leaves no file behind, never a SIGBUS. A segment that a
//    process able to write it truncates later still kills its members with SIGBUS, but each
//    first names the segment and what happened (segment_fault.h).
//  * The last member out removes the segment (RemoveIfLast, at exit), under the flock that
//    guards creation, so no segment outlives its group.
//  * Membership: every process that opens the segment is a member, under its job's label kept
//    in its slot (lease_liveness.h); fork(): a child never inherits its parent's identity, it
//    claims its own on first use.
#ifndef CROSSOVER_TF_OPS_CORE_LEASE_SEGMENT_H_
#define CROSSOVER_TF_OPS_CORE_LEASE_SEGMENT_H_

#include <pthread.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/lease_dir.h"
#include "core/lease_internal.h"
#include "core/lease_liveness.h"
#include "core/lease_types.h"
#include "core/waiter_queue.h"

namespace crossover {

constexpr int64_t kPollNs = 20 * 1000 * 1000;  // liveness re-check period while waiting
// Bounds every take of the internal mutex except Acquire's (which waits until its own
// timeout): Yield, slot claims and job labels, and every link turn operation. A process
// stopped or wedged inside the mutex then turns into an error after this long, never a hang.
constexpr int64_t kInternalLockBoundNs = 10 * kNsPerS;
constexpr int64_t kLockGraceNs = 200 * 1000 * 1000;  // internal-lock wait past a passed deadline
constexpr int64_t kRemoveBoundNs = kNsPerS;  // the last member's wait for the creation flock

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
  Owner reserved_for;              // see DeviceLease::Yield(reserve_s)
  int64_t reserved_until_host_mono_ns;  // HostMonoNs
  int32_t reserved_priority;
  uint64_t next_ticket;
  WaiterQueue queue;
  Slot slots[kMaxProcesses];
  uint64_t total_handoffs;
  uint64_t total_recoveries;
  LinkTurnEntry link_turns[kMaxLinkTurnJobs];  // indexed by position
  int64_t held_since_host_mono_ns;  // the holder's hold, on the clock every member reads alike
  LeaseUsage usage[kMaxProcesses];  // per slot, for observers (the exporter)
  // An exclusion check that does not trust the holder field: a process sets `inside` to its
  // nonce once it returns from Acquire holding the device, and clears it in Yield; finding
  // another's nonce there (a live one: a dead holder's is cleared by DropDead) counts an
  // overlapping hold. Lock-free, outside the mutex on the way in. Must stay 0.
  std::atomic<uint64_t> inside;
  std::atomic<uint64_t> overlapping_holds;
  // Odd while a member is inside a change an observer must never see half done (the holder,
  // its start and the members' slots and counters; ObservedChange): an observer copies the
  // segment without the mutex (ReadSegment) and keeps a copy only if this is even and equal
  // in two copies, so a member preempted or stopped between two stores never shows a torn
  // state, e.g. a counter that seems to go back.
  std::atomic<uint32_t> change_seq;
};

// Brackets, under the mutex, a change that observers must see whole (SharedLease::change_seq).
class ObservedChange {
 public:
  explicit ObservedChange(SharedLease* s) : s_(s) { s_->change_seq.fetch_add(1); }
  ~ObservedChange() { s_->change_seq.fetch_add(1); }
  ObservedChange(const ObservedChange&) = delete;
  ObservedChange& operator=(const ObservedChange&) = delete;

 private:
  SharedLease* const s_;
};

// Who holds the segment's internal mutex, for a stuck lock's message: the process that holds
// it by the mutex itself (not by locker_pid alone), or that it cannot be told from here.
std::string MutexHolderText(const SharedLease& s);

// Wakes every thread waiting on the segment's futex word (bumping it first).
void WakeAll(SharedLease* s);
// Wakes them without bumping (the caller bumped it under the mutex).
void WakeWaiters(SharedLease* s);

// A segment file and how it must be owned. Every open, creation, check and removal of it
// goes through dir's descriptor, by base name, never by path again (lease_dir.h's links).
struct SegmentFile {
  std::shared_ptr<const TrustedDir> dir;
  std::string base;  // the file's name in dir: "crossover.<group>.<device_key>"
  std::string path;  // dir's resolved path + "/" + base: for messages and registry keys
  bool shared_group = false;
  gid_t dir_gid = 0;
};

// "/crossover.<group>.<device_key>": the lease's name, and its segment file in the directory.
std::string SegmentName(const std::string& group, const std::string& device_key);
// Checks the lease directory (it exists, is a directory, on a local file system) and names
// the segment file in it. dir "" is kDefaultLeaseDir.
LeaseStatus ResolveSegmentFile(const std::string& dir, const std::string& name,
                               bool shared_group, SegmentFile* out);
// True if path still names the file whose fstat is st (not renamed, removed or replaced).
bool NameRefersTo(const std::string& path, const struct stat& st);
// The same for the name base in the directory open at dir_fd.
bool NameRefersTo(int dir_fd, const std::string& base, const struct stat& st);
// Opens the segment file, creating it if missing and replacing it if it is stale or of another
// layout while nobody uses it; on success *fd_out holds the presence lock and *shared_out the
// mapping. What it replaced goes to warnings.
LeaseStatus OpenSegment(const SegmentFile& file, int* fd_out, SharedLease** shared_out,
                        std::vector<std::string>* warnings);
// Runs read on a copy of the segment file at path, as an observer (status, the exporter): the
// directory and the file must pass the observer's trust rule (lease_dir.h); the file is opened
// read-only and non-blocking, never mapped, its mutex never taken, and nothing is created,
// claimed or repaired. fd (no locks of its own, so it counts for nobody) tells slot liveness.
// It never blocks: two copies are read until they agree, for at most bound_s.
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
  // Whether slot i holds a live member (this process's own slot included).
  bool SlotAlive(int slot, uint64_t nonce) const;
  // An error unless the segment's name still refers to the file this process has mapped.
  LeaseStatus CheckNamed() const;
  // Removes the segment's name if no other process is live on it, under the creation flock
  // (bounded); a no-op if another is, or if the flock cannot be had in time. For exit.
  void RemoveIfLast();
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
  LeaseSegment(std::string name, const SegmentFile& file, std::string job, int fd,
               SharedLease* shared);
  LeaseStatus ClaimSlotLocked();

  const std::string name_;
  const std::string path_;
  const std::shared_ptr<const TrustedDir> dir_;  // removal goes through it (RemoveIfLast)
  const std::string base_;
  SharedLease* const shared_;
  struct stat held_ = {};  // the mapped file's fstat (its inode never changes): CheckNamed
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

// For tests only (testing/lease_test_hooks.h): segment creation pauses this long between
// sizing and initialising the segment.
void SetSegmentInitDelayMs(int ms);

}  // namespace crossover

#endif  // CROSSOVER_TF_OPS_CORE_LEASE_SEGMENT_H_
