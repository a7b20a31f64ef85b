// The device lease: acquire, yield, the waiter queue's use, statistics, and Inspect (see
// device_lease.h). The segment it lives in is lease_segment.h's.
#include "core/device_lease.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/event_ring.h"
#include "core/lease_registry.h"
#include "core/lease_segment.h"

namespace crossover {
namespace {

constexpr double kMaxInspectBoundS = 60;  // Inspect's longest internal-lock wait

// Group and device key characters: a job label's, less the separators it may use.
bool NameChar(char c) { return JobChar(c) && c != '.' && c != ':' && c != '@'; }

bool ValidChars(const std::string& s, size_t max_len, bool (*allowed)(char) = NameChar) {
  return !s.empty() && s.size() <= max_len && std::all_of(s.begin(), s.end(), allowed);
}

// Who is live on the segment (a member's mapping under the mutex, or an observer's copy);
// dead entries are skipped, not repaired. slot_alive(i, nonce): slot i is a live member's.
// now: HostMonoNs taken before s was read, so that the holder's current hold, counted up to
// it, never exceeds what its yield will count (an observer's counters never go back).
LeaseSnapshot TakeSnapshot(const SharedLease& s,
                           const std::function<bool(int, uint64_t)>& slot_alive, int64_t now) {
  auto live = [&](const Owner& o) {
    return o.slot >= 0 && o.slot < kMaxProcesses && s.slots[o.slot].nonce == o.nonce &&
           slot_alive(o.slot, o.nonce);
  };
  LeaseSnapshot snap;
  for (int i = 0; i < kMaxProcesses; ++i) {
    const Slot& slot = s.slots[i];
    if (!slot_alive(i, slot.nonce)) continue;
    const bool holding = !s.holder.empty() && s.holder.nonce == slot.nonce;
    snap.members.push_back(LeaseMember{ReadJob(slot.job), slot.pid, slot.pid_ns, holding,
                                       s.usage[i]});
    if (holding) {
      snap.held_for_ns = std::max<int64_t>(0, now - s.held_since_host_mono_ns);
      snap.members.back().usage.hold_ns += snap.held_for_ns;
    }
  }
  if (!s.holder.empty() && live(s.holder)) snap.held_since_wall_ns = s.held_since_wall_ns;
  snap.overlapping_holds = s.overlapping_holds.load();
  snap.handoffs = s.total_handoffs;
  snap.recoveries = s.total_recoveries;
  for (int i = 0; i < std::clamp(s.queue.size, 0, kMaxWaiters); ++i) {
    const Waiter& w = s.queue.entries[i];
    if (w.deadline_host_mono_ns < now || w.who.empty() || !live(w.who)) continue;
    snap.queue.push_back(LeaseWaiter{ReadJob(s.slots[w.who.slot].job), w.who.pid,
                                     w.who.pid_ns, w.priority, w.since_wall_ns});
  }
  return snap;
}

void CountAcquire(LeaseUsage* u, int64_t waited_ns, bool handoff, bool contended) {
  u->acquires++;
  u->contended += contended;
  u->handoffs += handoff;
  u->wait_ns += waited_ns;
  int bucket = 0;
  while (bucket < kWaitBuckets - 1 && waited_ns > kWaitBucketUpperNs[bucket]) ++bucket;
  u->wait_buckets[bucket]++;
}

// The overlapping-hold check (SharedLease::inside): on the way into a hold, another live
// process's nonce there means two holds at once. Counted on entry only, once per overlap.
void EnterHold(SharedLease* s, uint64_t nonce) {
  uint64_t found = 0;
  if (!s->inside.compare_exchange_strong(found, nonce) && found != nonce) {
    s->overlapping_holds.fetch_add(1);
    s->inside.store(nonce);
  }
}
// On the way out: clears our mark, never another process's.
void LeaveHold(SharedLease* s, uint64_t nonce) {
  s->inside.compare_exchange_strong(nonce, 0);
}

}  // namespace

const char* const kLeaseStatsFields[9] = {"acquires", "handoffs",   "contended",
                                          "recoveries", "wait_s",   "hold_s",
                                          "max_wait_s", "max_hold_s", "held"};

std::vector<double> LeaseStats::Values() const {
  return {static_cast<double>(acquires), static_cast<double>(handoffs),
          static_cast<double>(contended), static_cast<double>(recoveries), wait_s, hold_s,
          max_wait_s, max_hold_s, held ? 1.0 : 0.0};
}

// ----- names and arguments ----------------------------------------------------------------

LeaseStatus DeviceLease::ValidateName(const std::string& group, const std::string& device_key) {
  if (!ValidChars(group, kMaxGroupLen)) {
    return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                              "crossover lease group '" + group + "' is invalid: use 1-" +
                                  std::to_string(kMaxGroupLen) + " characters from [A-Za-z0-9_-]");
  }
  if (!ValidChars(device_key, kMaxDeviceKeyLen)) {
    return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                              "crossover lease device key '" + device_key + "' is invalid: use 1-" +
                                  std::to_string(kMaxDeviceKeyLen) +
                                  " characters from [A-Za-z0-9_-]");
  }
  return LeaseStatus::Ok();
}

LeaseStatus DeviceLease::ValidateJob(const std::string& job) {
  if (job.empty() || ValidChars(job, kMaxJobLen, JobChar)) return LeaseStatus::Ok();
  return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                            "crossover lease job label '" + job + "' is invalid: use 1-" +
                                std::to_string(kMaxJobLen) +
                                " characters from [A-Za-z0-9_.:@-] (or none: <host>:<pid>)");
}

LeaseStatus DeviceLease::ValidatePriority(int64_t priority) {
  if (priority >= kSecondary && priority <= kPrimary) return LeaseStatus::Ok();
  return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                            "crossover lease priority must be 0 (secondary), 1 (normal) or 2 "
                            "(primary), got " + std::to_string(priority));
}

LeaseStatus DeviceLease::ValidateReserve(double reserve_s) {
  if (std::isfinite(reserve_s) && reserve_s >= 0 && reserve_s <= kMaxReserveS) {
    return LeaseStatus::Ok();
  }
  std::ostringstream msg;
  msg << "crossover lease reservation must be in [0, " << kMaxReserveS << "] s, got "
      << reserve_s;
  return LeaseStatus::Error(LeaseCode::kInvalidArgument, msg.str());
}

LeaseStatus DeviceLease::ValidateTimeout(double timeout_s) {
  if (std::isfinite(timeout_s) && timeout_s > 0 && timeout_s <= kMaxTimeoutS) {
    return LeaseStatus::Ok();
  }
  std::ostringstream msg;
  msg << "crossover lease timeout must be a number of seconds in (0, " << kMaxTimeoutS
      << "], got " << timeout_s
      << " (a finite bound turns a stuck peer into an error instead of a hang)";
  return LeaseStatus::Error(LeaseCode::kInvalidArgument, msg.str());
}

LeaseStatus DeviceLease::SegmentPath(const std::string& dir, const std::string& group,
                                     const std::string& device_key, std::string* path) {
  LeaseStatus status = ValidateName(group, device_key);
  SegmentFile file;
  if (status.ok()) status = ResolveSegmentFile(dir, SegmentName(group, device_key), false, &file);
  if (status.ok()) *path = file.path;
  return status;
}

LeaseStatus DeviceLease::Inspect(const std::string& path, double bound_s, LeaseSnapshot* out) {
  if (!(std::isfinite(bound_s) && bound_s > 0 && bound_s <= kMaxInspectBoundS)) {
    return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                              "crossover lease inspection bound must be in (0, " +
                                  std::to_string(static_cast<int>(kMaxInspectBoundS)) + "] s");
  }
  const int64_t now = HostMonoNs();
  return ReadSegment(path, bound_s, [out, now](int fd, const SharedLease& s) {
    *out = TakeSnapshot(s, [fd](int slot, uint64_t nonce) {
      return nonce != 0 && SlotLocked(fd, slot);
    }, now);
  });
}

// ----- this process's lease ---------------------------------------------------------------

LeaseStatus DeviceLease::Get(const std::string& group, const std::string& device_key,
                             std::shared_ptr<DeviceLease>* out, const SegmentLocation& location) {
  return LeaseRegistry::Open(group, device_key, location, out, nullptr);
}

DeviceLease::DeviceLease(std::shared_ptr<LeaseSegment> segment)
    : segment_(std::move(segment)), events_(new EventRing<LeaseEvent>()) {}

DeviceLease::~DeviceLease() { Yield(); }

const std::string& DeviceLease::name() const { return segment_->name(); }
const std::string& DeviceLease::path() const { return segment_->path(); }

LeaseStatus DeviceLease::Register() {
  Owner me;
  return segment_->Identity(&me);
}

LeaseStatus DeviceLease::Members(LeaseSnapshot* out) {
  Owner me;
  LeaseStatus status = segment_->Identity(&me);
  if (status.ok()) status = segment_->CheckNamed();
  if (!status.ok()) return status;
  SegmentLock locked(segment_.get());
  status = locked.Lock(MonoNs() + kInternalLockBoundNs);
  if (!status.ok()) return status;
  const LeaseSegment* segment = segment_.get();
  *out = TakeSnapshot(*segment_->shared(), [segment](int slot, uint64_t nonce) {
    return segment->SlotAlive(slot, nonce);
  }, HostMonoNs());
  return LeaseStatus::Ok();
}

void DeviceLease::UnlockAfterFork(bool child) {
  if (child) stats_.held = false;  // the parent's hold stays the parent's
  local_mu_.unlock();
}

// ----- acquire and yield ------------------------------------------------------------------

LeaseStatus DeviceLease::Acquire(double timeout_s, int64_t tag, int32_t priority) {
  LeaseStatus status = ValidateTimeout(timeout_s);
  if (status.ok()) status = ValidatePriority(priority);
  if (!status.ok()) return status;
  Owner me;
  status = segment_->Identity(&me);
  if (status.ok()) status = segment_->CheckNamed();  // a renamed segment: not one lease any more
  if (!status.ok()) return status;
  const int64_t start_mono = MonoNs();
  const int64_t request_wall = WallNs();
  const int64_t deadline = start_mono + static_cast<int64_t>(timeout_s * 1e9);
  SharedLease* s = segment_->shared();
  SegmentLock locked(segment_.get());
  status = locked.Lock(deadline);
  if (!status.ok()) return status;
  bool contended = false, reentrant = false;
  status = WaitInQueue(&locked, me, priority, deadline, timeout_s, &contended, &reentrant);
  if (!status.ok() || reentrant) return status;
  const bool handoff = !s->last_holder.empty() && !(s->last_holder == me);
  int64_t acquired_wall;
  {
    ObservedChange change(s);
    // WaitInQueue let us in, so no reservation holds against us: ours is used up, and one
    // left for a class no higher than ours has expired or is overtaken by this hold.
    s->reserved_for = Owner{};
    s->held_since_wall_ns = acquired_wall = WallNs();
    s->held_since_host_mono_ns = HostMonoNs();
    s->holder = me;
    s->last_holder = me;
    if (handoff) ++s->total_handoffs;
    CountAcquire(&s->usage[me.slot], MonoNs() - start_mono, handoff, contended);
  }
  locked.Unlock();
  EnterHold(s, me.nonce);
  RecordAcquired(request_wall, acquired_wall, start_mono, handoff, contended, tag, priority);
  return LeaseStatus::Ok();
}

// True while another live process's reservation keeps waiters of this class out.
bool DeviceLease::ReservedAgainst(const Owner& me, int32_t priority) const {
  const SharedLease* s = segment_->shared();
  return !s->reserved_for.empty() && !(s->reserved_for == me) &&
         priority < s->reserved_priority && HostMonoNs() < s->reserved_until_host_mono_ns &&
         segment_->Alive(s->reserved_for);
}

// Each waiting thread has its own ticket in the waiter queue and removes only that ticket.
LeaseStatus DeviceLease::WaitInQueue(SegmentLock* locked, const Owner& me, int32_t priority,
                                     int64_t deadline, double timeout_s, bool* contended,
                                     bool* reentrant) {
  SharedLease* s = segment_->shared();
  uint64_t ticket = 0;
  for (;;) {
    if (s->holder == me) {  // held already, by this or another thread of this process
      if (ticket) s->queue.Remove(ticket);
      *reentrant = true;
      return LeaseStatus::Ok();
    }
    const int position = ticket ? s->queue.Index(ticket) : -1;
    const bool first = ticket ? position == 0 : s->queue.size == 0;
    if (s->holder.empty() && first && !ReservedAgainst(me, priority)) {
      if (ticket) s->queue.Remove(ticket);
      return LeaseStatus::Ok();
    }
    const int64_t now = MonoNs();
    if (ticket && position < 0 && now >= deadline) return TimeoutError(timeout_s, me);  // expired
    if (ticket == 0 || position < 0) {  // queue up (again, if our entry was dropped)
      if (ticket) locked->Warn("a waiter's queue entry of " + name() + " vanished; requeueing");
      ticket = ++s->next_ticket;
      if (!s->queue.Push(
              Waiter{me, ticket, WallNs(), priority, deadline - TimeNamespaceOffsetNs()})) {
        return LeaseStatus::Error(
            LeaseCode::kResourceExhausted,
            "crossover lease " + name() + " already has " + std::to_string(kMaxWaiters) +
                " waiting threads, the most it queues; too many jobs or threads share "
                "one device");
      }
      *contended = true;
      continue;
    }
    if (now >= deadline) {
      s->queue.Remove(ticket);
      return TimeoutError(timeout_s, me);
    }
    // On failure our ticket stays, but it carries our deadline: a timed-out Lock has waited
    // past it, so the ticket has expired already (and any other failure leaves a lease that
    // is unusable anyway, the ticket expiring at the deadline). The next process to take the
    // lock drops it (DropDead), whoever that is, without waiting for this thread to return,
    // so no process-local record of it is needed.
    LeaseStatus status = locked->AwaitChange(deadline - now, deadline);
    if (!status.ok()) return status;
  }
}

LeaseStatus DeviceLease::TimeoutError(double timeout_s, const Owner& me) const {
  const SharedLease* s = segment_->shared();
  std::ostringstream msg;
  msg << "crossover lease " << name() << ": acquire timed out after " << timeout_s << " s; ";
  if (!s->holder.empty()) {
    msg << "held by pid " << s->holder.pid;
    if (s->holder.pid_ns != me.pid_ns) msg << " (of another PID namespace)";
    msg << " for " << (WallNs() - s->held_since_wall_ns) / 1e9 << " s";
  } else {
    msg << "queued behind " << s->queue.size << " other waiting thread(s)";
  }
  msg << " (a peer job stuck or holding the device too long?)";
  return LeaseStatus::Error(LeaseCode::kDeadlineExceeded, msg.str());
}

LeaseStatus DeviceLease::Yield(double reserve_s) {
  LeaseStatus status = ValidateReserve(reserve_s);
  if (!status.ok()) return status;
  Owner me;
  status = segment_->Identity(&me);
  if (!status.ok()) return status;
  int32_t priority;
  {
    std::lock_guard<std::mutex> local(local_mu_);  // never inside the shared mutex: lock order
    priority = held_priority_;
  }
  SharedLease* s = segment_->shared();
  SegmentLock locked(segment_.get());
  status = locked.Lock(MonoNs() + kInternalLockBoundNs);
  if (!status.ok()) return status;
  if (!(s->holder == me)) {
    LeaveHold(s, me.nonce);  // a mark left by a hold another thread of ours released early
    return LeaseStatus::Ok();
  }
  // Stamped while still holding: the next holder's acquired_ns is taken after ours under the
  // same mutex, so the two processes' timelines never seem to overlap.
  const int64_t yielded_wall = WallNs(), yielded_mono = MonoNs();
  if (reserve_s > 0) {
    s->reserved_for = me;
    s->reserved_priority = priority;
    s->reserved_until_host_mono_ns =
        yielded_mono - TimeNamespaceOffsetNs() + static_cast<int64_t>(reserve_s * 1e9);
  }
  {
    ObservedChange change(s);
    s->usage[me.slot].hold_ns += HostMonoNs() - s->held_since_host_mono_ns;
    LeaveHold(s, me.nonce);
    s->holder = Owner{};
  }
  s->wake_seq.fetch_add(1);
  const bool wake = s->queue.size > 0;
  locked.Unlock();
  if (wake) WakeWaiters(s);
  RecordYielded(yielded_wall, yielded_mono);
  return LeaseStatus::Ok();
}

LeaseStatus DeviceLease::YieldAfter(const std::function<LeaseStatus()>& drain,
                                      double reserve_s) {
  const LeaseStatus drained = drain();
  const LeaseStatus released = Yield(reserve_s);
  return drained.ok() ? released : drained;
}

// ----- this process's statistics and timeline ---------------------------------------------

void DeviceLease::RecordAcquired(int64_t request_wall, int64_t acquired_wall, int64_t start_mono,
                                 bool handoff, bool contended, int64_t tag, int32_t priority) {
  const int64_t acquired_mono = MonoNs();
  std::lock_guard<std::mutex> local(local_mu_);
  const double waited = (acquired_mono - start_mono) / 1e9;
  stats_.acquires++;
  stats_.handoffs += handoff;
  stats_.contended += contended;
  stats_.wait_s += waited;
  stats_.max_wait_s = std::max(stats_.max_wait_s, waited);
  stats_.held = true;
  held_since_mono_ns_ = acquired_mono;
  held_priority_ = priority;
  events_->Push(LeaseEvent{request_wall, acquired_wall, 0, tag});
}

void DeviceLease::RecordYielded(int64_t yielded_wall, int64_t yielded_mono) {
  std::lock_guard<std::mutex> local(local_mu_);
  const double held = (yielded_mono - held_since_mono_ns_) / 1e9;
  stats_.hold_s += held;
  stats_.max_hold_s = std::max(stats_.max_hold_s, held);
  stats_.held = false;
  if (LeaseEvent* last = events_->Last()) last->yielded_ns = yielded_wall;
}

LeaseStats DeviceLease::Stats() const {
  std::lock_guard<std::mutex> local(local_mu_);
  LeaseStats stats = stats_;
  stats.recoveries = segment_->recoveries();
  return stats;
}

std::vector<LeaseEvent> DeviceLease::Timeline() const {
  std::lock_guard<std::mutex> local(local_mu_);
  return events_->Ordered();
}

}  // namespace crossover
