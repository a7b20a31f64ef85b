// This process on a lease segment (its identity, claimed on first use and after fork) and the
// segment's internal mutex (see lease_segment.h). Opening the file is lease_segment_file.cc's.
#include "core/lease_segment.h"
#include "core/segment_fault.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>

namespace crossover {
namespace {

long Futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* timeout) {
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, timeout, nullptr, 0);
}

}  // namespace

void WakeWaiters(SharedLease* s) { Futex(&s->wake_seq, FUTEX_WAKE, INT_MAX, nullptr); }

void WakeAll(SharedLease* s) {
  s->wake_seq.fetch_add(1);
  WakeWaiters(s);
}

// ----- this process on the segment ---------------------------------------------------------

LeaseStatus LeaseSegment::Open(const SegmentFile& file, const std::string& name,
                               const std::string& job, std::shared_ptr<LeaseSegment>* out,
                               std::vector<std::string>* warnings) {
  int fd = -1;
  SharedLease* shared = nullptr;
  LeaseStatus status = OpenSegment(file, &fd, &shared, warnings);
  if (status.ok()) {
    std::shared_ptr<LeaseSegment> segment(new LeaseSegment(name, file, job, fd, shared));
    Owner me;
    status = segment->Identity(&me);  // claims our slot; repairs state left by crashed runs
    if (status.ok()) *out = std::move(segment);
  }
  return status;
}

LeaseSegment::LeaseSegment(std::string name, const SegmentFile& file, std::string job, int fd,
                           SharedLease* shared)
    : name_(std::move(name)),
      path_(file.path),
      dir_(file.dir),
      base_(file.base),
      shared_(shared),
      lock_fd_(fd),
      job_(std::move(job)) {
  fstat(fd, &held_);
}

LeaseSegment::~LeaseSegment() {
  UnwatchSegmentMapping(shared_);
  munmap(shared_, sizeof(SharedLease));
  if (lock_fd_ >= 0) close(lock_fd_);  // drops our slot lock: we are gone
}

LeaseStatus LeaseSegment::Identity(Owner* me) {
  std::lock_guard<std::mutex> local(identity_mu_);
  if (identity_pid_ != getpid()) {
    LeaseStatus status = ClaimSlotLocked();
    if (!status.ok()) return status;
  }
  *me = me_;
  return LeaseStatus::Ok();
}

LeaseStatus LeaseSegment::ClaimSlotLocked() {
  if (lock_fd_ < 0) {
    return LeaseStatus::Error(LeaseCode::kInternal,
                              "lease " + name_ + " could not be reopened after fork()");
  }
  // Under the internal mutex, so that a slot's lock byte and its record change together for
  // anyone who reads both under it (Inspect).
  SegmentLock locked(this);
  LeaseStatus status = locked.Lock(MonoNs() + kInternalLockBoundNs);
  if (!status.ok()) return status;
  int slot = -1;
  status = LockFreeSlot(lock_fd_, name_, &slot);
  if (!status.ok()) return status;
  if (slot < 0) {
    return LeaseStatus::Error(LeaseCode::kResourceExhausted,
                              "lease " + name_ + " is open in " + std::to_string(kMaxProcesses) +
                                  " processes already, the most one device supports");
  }
  const Owner me{RandomNonce(), slot, static_cast<int32_t>(getpid()), PidNamespace()};
  Slot& record = shared_->slots[slot];
  {
    ObservedChange change(shared_);
    shared_->usage[slot] = LeaseUsage{};  // the slot's previous member's counters are not ours
    record.nonce = me.nonce;
    record.pid = me.pid;
    record.pid_ns = me.pid_ns;
    WriteJob(record.job, job_.empty() ? DefaultJob() : job_);
  }
  locked.Unlock();
  me_ = me;
  my_nonce_.store(me.nonce);
  identity_pid_ = getpid();
  return LeaseStatus::Ok();
}

// fork() support: the child must not keep its parent's slot lock alive (it would make a dead
// parent look alive) nor believe it is its parent.
void LeaseSegment::UnlockAfterFork(bool child) {
  if (child) {
    // Reopen the segment as a new open file description; dup3 drops our reference to the
    // parent's (and with it any claim on the parent's slot lock).
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", lock_fd_);
    const int fresh = open(path, O_RDWR | O_CLOEXEC);
    if (fresh >= 0) {
      dup3(fresh, lock_fd_, O_CLOEXEC);
      close(fresh);
      HoldPresence(lock_fd_);  // the new description has none; best effort, the slot follows
    } else {
      close(lock_fd_);
      lock_fd_ = -1;
    }
    identity_pid_ = 0;
    me_ = Owner{};
    // my_nonce_ keeps the parent's nonce until we claim our own: the parent then counts as
    // alive to us, never as a dead holder to reclaim from.
  }
  identity_mu_.unlock();
}

bool LeaseSegment::Alive(const Owner& o) const {
  if (o.empty()) return false;
  if (o.nonce == my_nonce_.load()) return true;
  return OwnerLive(lock_fd_, shared_->slots, o);
}

bool LeaseSegment::SlotAlive(int slot, uint64_t nonce) const {
  // Our own slot's lock is held through lock_fd_, where it never shows as a conflict.
  return nonce != 0 && (nonce == my_nonce_.load() || SlotLocked(lock_fd_, slot));
}

LeaseStatus LeaseSegment::CheckNamed() const {
  if (NameRefersTo(path_, held_)) return LeaseStatus::Ok();
  return LeaseStatus::Error(
      LeaseCode::kFailedPrecondition,
      "crossover lease segment " + path_ + " was renamed, removed or replaced while this job "
      "had it open: the jobs of the group are no longer on one lease, so two of them could "
      "hold the device at once. Stop the group's jobs and check who can write to the lease "
      "directory (the trust rule, docs/deploying.md)");
}

void LeaseSegment::RemoveIfLast() {
  // At exit another thread may be anywhere: never wait for it.
  std::unique_lock<std::mutex> local(identity_mu_, std::try_to_lock);
  if (!local.owns_lock() || lock_fd_ < 0) return;
  const int64_t deadline = MonoNs() + kRemoveBoundNs;
  while (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    if ((errno != EWOULDBLOCK && errno != EINTR) || MonoNs() >= deadline) return;
    usleep(1000);
  }
  // Any lock by another open file description (a member's presence or slot, an opener past
  // the flock) means someone is live on it. Opening files hold the flock until they are.
  if (LiveProcess(lock_fd_).empty() && NameRefersTo(dir_->fd(), base_, held_)) {
    // May fail (a sticky directory, another member's file): harmless.
    unlinkat(dir_->fd(), base_.c_str(), 0);
  }
  // Leaving for good: drop this process's own locks (its presence and slot bytes) before the
  // flock goes back, so that a member exiting at the same moment, next under the flock, finds
  // nobody live and removes the segment. Before, each of two last members saw the other's
  // locks (held until its process ended) and neither removed it: a segment left with no
  // members. The description is this process's own (a forked child reopens its own), so no
  // other process's liveness goes with it.
  struct flock all = {};
  all.l_type = F_UNLCK;
  all.l_whence = SEEK_SET;
  all.l_start = 0;
  all.l_len = 0;  // the whole file
  fcntl(lock_fd_, F_OFD_SETLK, &all);
  flock(lock_fd_, LOCK_UN);
}

LeaseStatus LeaseSegment::AdoptJob(const std::string& job) {
  if (job.empty()) return LeaseStatus::Ok();
  std::lock_guard<std::mutex> local(identity_mu_);
  if (job_ == job) return LeaseStatus::Ok();
  if (!job_.empty()) {
    return LeaseStatus::Error(
        LeaseCode::kInvalidArgument,
        "crossover lease " + path_ + " is open in this process as job '" + job_ + "', not '" +
            job + "': a process belongs to one job, so give every lease it opens one label");
  }
  job_ = job;
  if (identity_pid_ != getpid()) return LeaseStatus::Ok();  // the next claim writes it
  SegmentLock locked(this);
  const LeaseStatus status = locked.Lock(MonoNs() + kInternalLockBoundNs);
  if (!status.ok()) return status;
  Slot& record = shared_->slots[me_.slot];
  if (record.nonce == me_.nonce) {
    ObservedChange change(shared_);
    WriteJob(record.job, job_);
  }
  return LeaseStatus::Ok();
}

void LeaseSegment::CountRecoveries(int repaired) {
  shared_->total_recoveries += repaired;
  recoveries_.fetch_add(repaired);
}

// ----- the internal mutex -----------------------------------------------------------------

namespace {

// The process whose thread tid is, as this process's PID namespace sees it: 0 if none is.
pid_t ProcessOfThread(pid_t tid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/status", static_cast<int>(tid));
  FILE* status = fopen(path, "re");
  if (status == nullptr) return 0;
  char line[256];
  pid_t tgid = 0;
  while (fgets(line, sizeof(line), status) != nullptr) {
    if (sscanf(line, "Tgid: %d", &tgid) == 1) break;
  }
  fclose(status);
  return tgid;
}

}  // namespace

std::string MutexHolderText(const SharedLease& s) {
  // glibc keeps the holder's thread id in the robust mutex (the kernel's robust-futex word: it
  // is what marks the holder dead). locker_pid is only what a member recorded after taking it:
  // a process that took the mutex some other way (a group member's own code) leaves it stale.
  const pid_t tid = s.mu.__data.__owner & FUTEX_TID_MASK;
  const pid_t recorded = s.locker_pid.load();
  if (tid == 0) return "no thread now (it was let go as the wait ended)";
  const pid_t process = ProcessOfThread(tid);
  if (process != 0 && process == recorded) return "pid " + std::to_string(process);
  if (process != 0) {
    return "pid " + std::to_string(process) + " (its thread " + std::to_string(tid) +
           "), which took it without recording itself (the last recorded taker was pid " +
           std::to_string(recorded) + ")";
  }
  return "a thread this process cannot see (thread id " + std::to_string(tid) + " in its own "
         "PID namespace; the last recorded taker was pid " + std::to_string(recorded) +
         "), so which process holds it cannot be told from here";
}

LeaseStatus SegmentLock::Lock(int64_t deadline_mono) {
  const timespec abs = ToTimespec(std::max(deadline_mono, MonoNs() + kLockGraceNs));
  const int rc = pthread_mutex_clocklock(&s_->mu, CLOCK_MONOTONIC, &abs);
  if (rc == ETIMEDOUT) {
    return LeaseStatus::Error(
        LeaseCode::kDeadlineExceeded,
        "crossover lease " + segment_->name() + ": its internal lock is held by " +
            MutexHolderText(*s_) +
            ", which has not let go (a stopped process, e.g. Ctrl-Z, or a wedged one?); "
            "resume or kill it");
  }
  if (rc != 0 && rc != EOWNERDEAD) {
    return LeaseStatus::Error(LeaseCode::kInternal,
                              "lease " + segment_->name() + " is unusable (" + strerror(rc) +
                                  "); stop its jobs and remove " + segment_->path());
  }
  locked_ = true;
  s_->locker_pid.store(getpid());
  if (rc == EOWNERDEAD) {  // a process died inside the critical section
    pthread_mutex_consistent(&s_->mu);
    Warn("a process died while updating " + segment_->name() + "; repairing its state");
    segment_->CountRecoveries(1);
  }
  DropDead();
  return LeaseStatus::Ok();
}

void SegmentLock::Unlock() {
  if (locked_) pthread_mutex_unlock(&s_->mu);
  locked_ = false;
  for (const std::string& w : warnings_) EmitWarning(w);
  warnings_.clear();
}

LeaseStatus SegmentLock::AwaitChange(int64_t remaining_ns, int64_t relock_deadline) {
  const uint32_t seq = s_->wake_seq.load();
  Unlock();
  const timespec wait = ToTimespec(std::min(kPollNs, remaining_ns));
  Futex(&s_->wake_seq, FUTEX_WAIT, seq, &wait);
  return Lock(relock_deadline ? relock_deadline : MonoNs() + kInternalLockBoundNs);
}

void SegmentLock::DropDead() {
  auto alive = [this](const Owner& o) { return segment_->Alive(o); };
  int repaired = 0;
  if (!s_->holder.empty() && !alive(s_->holder)) {
    Warn("holder pid " + std::to_string(s_->holder.pid) + " of " + segment_->name() +
         " is gone; reclaiming the lease");
    ObservedChange change(s_);
    uint64_t dead = s_->holder.nonce;  // it never left its hold: clear its overlap mark
    s_->inside.compare_exchange_strong(dead, 0);
    s_->holder = Owner{};
    ++repaired;
  }
  // Expired entries go too: a waiter that could not take this lock by its deadline (a
  // process stopped inside it) returned without removing its ticket, and lives on.
  repaired += s_->queue.Repair(alive, HostMonoNs());
  for (int i = 0; i < kMaxLinkTurnJobs; ++i) {
    LinkTurnEntry& e = s_->link_turns[i];
    if (e.state != kLinkTurnFree && !alive(e.who)) {
      Warn("job at link turn position " + std::to_string(i) + " of " + segment_->name() +
           " (pid " + std::to_string(e.who.pid) + ") is gone; its turns are no longer waited for");
      e = LinkTurnEntry{};
      ++repaired;
    }
  }
  if (repaired) {
    segment_->CountRecoveries(repaired);
    WakeAll(s_);
  }
}

}  // namespace crossover
