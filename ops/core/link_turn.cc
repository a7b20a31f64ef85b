// The link turn (see link_turn.h): joining, waiting for and finishing turns in the segment's
// link turn table, and this process's turn statistics.
#include "core/link_turn.h"

#include <algorithm>

#include "core/device_lease.h"
#include "core/event_ring.h"
#include "core/lease_registry.h"
#include "core/lease_segment.h"

namespace crossover {

const char* const kLinkTurnStatsFields[5] = {"turns", "waited", "skipped", "wait_s",
                                             "max_wait_s"};

std::vector<double> LinkTurnStats::Values() const {
  return {static_cast<double>(turns), static_cast<double>(waited),
          static_cast<double>(skipped), wait_s, max_wait_s};
}

LeaseStatus LinkTurn::Get(const std::string& group, const std::string& device_key,
                          std::shared_ptr<LinkTurn>* out, const SegmentLocation& location) {
  return LeaseRegistry::Open(group, device_key, location, nullptr, out);
}

LinkTurn::LinkTurn(std::shared_ptr<LeaseSegment> segment)
    : segment_(std::move(segment)), events_(new EventRing<LinkTurnEvent>()) {}

LinkTurn::~LinkTurn() { Leave(); }

const std::string& LinkTurn::name() const { return segment_->name(); }

LinkTurnEntry* LinkTurn::Table() const { return segment_->shared()->link_turns; }

LeaseStatus LinkTurn::ValidatePosition(int64_t position, int64_t jobs) {
  if (jobs >= 1 && jobs <= kMaxLinkTurnJobs && position >= 0 && position < jobs) {
    return LeaseStatus::Ok();
  }
  return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                            "crossover link turn: jobs must be in [1, " +
                                std::to_string(kMaxLinkTurnJobs) + "] and position in [0, jobs), got "
                                "position " + std::to_string(position) + " of " +
                                std::to_string(jobs) + " jobs");
}

LeaseStatus LinkTurn::Join(int32_t position, int32_t jobs, int64_t* next_index) {
  LeaseStatus status = ValidatePosition(position, jobs);
  Owner me;
  if (status.ok()) status = segment_->Identity(&me);
  if (!status.ok()) return status;
  LinkTurnEntry* table = Table();
  SegmentLock locked(segment_.get());
  status = locked.Lock(MonoNs() + kInternalLockBoundNs);
  if (!status.ok()) return status;
  int64_t next = kLinkTurnUnconstrained;
  for (int i = 0; i < kMaxLinkTurnJobs; ++i) {
    const LinkTurnEntry& e = table[i];
    if (e.state == kLinkTurnFree || e.who == me) continue;
    if (e.jobs != jobs) {
      return LeaseStatus::Error(
          LeaseCode::kInvalidArgument,
          "crossover link turn of " + name() + ": pid " + std::to_string(e.who.pid) +
              " joined as one of " + std::to_string(e.jobs) + " jobs, this process as one of " +
              std::to_string(jobs) + "; every job of the group must name the same count");
    }
    if (i == position) {
      return LeaseStatus::Error(
          LeaseCode::kInvalidArgument,
          "crossover link turn position " + std::to_string(position) + " of " + name() +
              " is taken by pid " + std::to_string(e.who.pid) +
              "; give each job of the group its own position");
    }
    // The latest index whose turn at `position` comes before e's next turn.
    if (e.state == kLinkTurnActive) next = std::min(next, e.offset + e.done - (position > i));
  }
  for (int i = 0; i < kMaxLinkTurnJobs; ++i) {
    if (table[i].who == me) table[i] = LinkTurnEntry{};
  }
  table[position] = LinkTurnEntry{me, kLinkTurnJoining, jobs, 0, 0};
  locked.Unlock();
  std::lock_guard<std::mutex> local(mu_);
  position_ = position;
  *next_index = next;
  return LeaseStatus::Ok();
}

LeaseStatus LinkTurn::MyEntry(SegmentLock* locked, int32_t* position) {
  Owner me;
  LeaseStatus status = segment_->Identity(&me);
  if (!status.ok()) return status;
  {
    std::lock_guard<std::mutex> local(mu_);
    *position = position_;
  }
  status = locked->Lock(MonoNs() + kInternalLockBoundNs);
  if (!status.ok()) return status;
  if (*position < 0 || !(Table()[*position].who == me)) {
    return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                              "crossover link turn of " + name() + ": this process has not "
                              "joined (LinkTurnJoin before LinkTurnStart, LinkTurnWait or LinkTurnDone)");
  }
  return LeaseStatus::Ok();
}

LeaseStatus LinkTurn::Start(int64_t offset) {
  if (offset <= -kLinkTurnUnconstrained || offset >= kLinkTurnUnconstrained) {
    return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                              "crossover link turn offset must be within +-2^62, got " +
                                  std::to_string(offset));
  }
  SegmentLock locked(segment_.get());
  int32_t position;
  const LeaseStatus status = MyEntry(&locked, &position);
  if (!status.ok()) return status;
  LinkTurnEntry& e = Table()[position];
  e.state = kLinkTurnActive;
  e.offset = offset;
  e.done = 0;
  WakeAll(segment_->shared());
  return LeaseStatus::Ok();
}

int LinkTurn::Blocker(int32_t position) const {
  const LinkTurnEntry& mine = Table()[position];
  const int64_t g = mine.offset + mine.done;
  for (int i = 0; i < kMaxLinkTurnJobs; ++i) {
    const LinkTurnEntry& e = Table()[i];
    if (i == position || e.state != kLinkTurnActive) continue;
    const int64_t their = e.offset + e.done;
    if (their < g || (their == g && i < position)) return i;
  }
  return -1;
}

LeaseStatus LinkTurn::Wait(double wait_s, bool* skipped) {
  *skipped = false;
  LeaseStatus status = DeviceLease::ValidateTimeout(wait_s);
  if (!status.ok()) return status;
  const int64_t start = MonoNs(), request_wall = WallNs();
  const int64_t deadline = start + static_cast<int64_t>(wait_s * 1e9);
  SegmentLock locked(segment_.get());
  int32_t position;
  status = MyEntry(&locked, &position);
  if (!status.ok()) return status;
  if (Table()[position].state != kLinkTurnActive) {
    return LeaseStatus::Error(LeaseCode::kInvalidArgument,
                              "crossover link turn of " + name() + ": LinkTurnStart first");
  }
  bool waited = false;
  while (Blocker(position) >= 0) {
    const int64_t now = MonoNs();
    if (now >= deadline) {
      *skipped = true;
      break;
    }
    waited = true;
    status = locked.AwaitChange(deadline - now);  // relocking also drops peers that died
    if (!status.ok()) return status;
  }
  // Stamped under the mutex, like the lease's release: the predecessor's done_ns was taken
  // before its count went up, so the two turns never seem to overlap in the timelines.
  const int64_t start_wall = WallNs();
  const int32_t slot = Table()[position].who.slot;
  if (slot >= 0 && slot < kMaxProcesses) {  // for observers (the exporter)
    ObservedChange change(segment_->shared());
    LeaseUsage& usage = segment_->shared()->usage[slot];
    usage.link_turns++;
    usage.link_turn_waits += waited;
    usage.link_turn_wait_ns += MonoNs() - start;
  }
  locked.Unlock();
  const double seconds = (MonoNs() - start) / 1e9;
  std::lock_guard<std::mutex> local(mu_);
  stats_.turns++;
  stats_.waited += waited;
  stats_.skipped += *skipped;
  stats_.wait_s += seconds;
  stats_.max_wait_s = std::max(stats_.max_wait_s, seconds);
  events_->Push(LinkTurnEvent{request_wall, start_wall, 0, *skipped ? 1 : 0});
  return LeaseStatus::Ok();
}

LeaseStatus LinkTurn::Done() {
  SegmentLock locked(segment_.get());
  int32_t position;
  const LeaseStatus status = MyEntry(&locked, &position);
  if (!status.ok()) return status;
  const int64_t done_wall = WallNs();
  Table()[position].done++;
  WakeAll(segment_->shared());
  locked.Unlock();
  std::lock_guard<std::mutex> local(mu_);
  if (LinkTurnEvent* last = events_->Last()) last->done_ns = done_wall;
  return LeaseStatus::Ok();
}

LeaseStatus LinkTurn::Leave() {
  int32_t position;
  {
    std::lock_guard<std::mutex> local(mu_);
    position = position_;
    position_ = -1;
  }
  if (position < 0) return LeaseStatus::Ok();
  Owner me;
  LeaseStatus status = segment_->Identity(&me);
  if (!status.ok()) return status;
  SegmentLock locked(segment_.get());
  status = locked.Lock(MonoNs() + kInternalLockBoundNs);
  if (!status.ok()) return status;
  LinkTurnEntry& mine = Table()[position];
  if (mine.who == me) mine = LinkTurnEntry{};
  WakeAll(segment_->shared());
  return LeaseStatus::Ok();
}

LinkTurnStats LinkTurn::Stats() const {
  std::lock_guard<std::mutex> local(mu_);
  return stats_;
}

std::vector<LinkTurnEvent> LinkTurn::Timeline() const {
  std::lock_guard<std::mutex> local(mu_);
  return events_->Ordered();
}

}  // namespace crossover
