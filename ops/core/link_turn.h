// The jobs' link turn: the order in which the jobs of a group run their gradient allreduces,
// so that they use the network one at a time instead of partly overlapping. It lives in the
// same segment as the device lease of (dir, group, device_key) (lease_segment.h) and shares its
// membership, but nothing else: it is a wait, never a hold. Nothing is owned while a process is
// blocked in a collective, and the order is one global order on every host.
//
// Job `position` of `jobs` (the same numbering on every host) runs its allreduce number k as
// global turn (offset + k, position), and the turns go in that order on every host. Turn
// (g, p) comes before (g', p') if g < g', or g == g' and p < p'.
#ifndef CROSSOVER_TF_OPS_CORE_LINK_TURN_H_
#define CROSSOVER_TF_OPS_CORE_LINK_TURN_H_

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/lease_types.h"

namespace crossover {

constexpr int64_t kLinkTurnUnconstrained = int64_t{1} << 62;  // Join with nobody turning

// Statistics of this process's link turns (cumulative since the segment was opened).
struct LinkTurnStats {
  uint64_t turns = 0;        // turns taken (Wait calls that returned)
  uint64_t waited = 0;       // turns that had to wait for another job's allreduce
  uint64_t skipped = 0;      // turns taken without the predecessor done (wait bound passed)
  double wait_s = 0, max_wait_s = 0;
  std::vector<double> Values() const;
};
extern const char* const kLinkTurnStatsFields[5];

// One link turn (wall-clock ns): asked for, begun (the wait is over), done (0: not yet).
struct LinkTurnEvent {
  int64_t request_ns = 0, start_ns = 0, done_ns = 0;
  int64_t skipped = 0;  // 1: begun because the wait bound passed, not because it was our turn
  std::array<int64_t, 4> Row() const { return {request_ns, start_ns, done_ns, skipped}; }
};

class LeaseSegment;
class SegmentLock;
struct LinkTurnEntry;
template <typename Event>
class EventRing;

class LinkTurn {
 public:
  // Returns the process-wide link turn of (group, device_key) in location.dir: the same segment
  // and membership as DeviceLease::Get with the same arguments (same rules and errors).
  static LeaseStatus Get(const std::string& group, const std::string& device_key,
                         std::shared_ptr<LinkTurn>* out,
                         const SegmentLocation& location = SegmentLocation());
  // jobs in [1, kMaxLinkTurnJobs], position in [0, jobs).
  static LeaseStatus ValidatePosition(int64_t position, int64_t jobs);

  // Joining is two calls around an agreement among the job's own ranks:
  //   Join   registers this process at `position`; returns the latest turn index that puts
  //          this job's first turn before the next turn of every job already turning here
  //          (kLinkTurnUnconstrained if none is);
  //   Start  with the offset the job's ranks agreed on (the min of Join's, or 0 if that is
  //          kLinkTurnUnconstrained).
  // A joining job thus goes first, and the jobs already turning wait at most for its first
  // allreduce, never the joiner for a peer that is momentarily not stepping (at a barrier,
  // say). Any offset is safe as long as all ranks of the job use the same one: the waits then
  // follow one total order and cannot form a cycle.
  LeaseStatus Join(int32_t position, int32_t jobs, int64_t* next_index);
  LeaseStatus Start(int64_t offset);
  // Blocks until every earlier turn of the other jobs turning on this host is done, or for
  // wait_s at most (then *skipped: the order is only a schedule, never needed for
  // correctness, and a paused peer must not stall this job). A peer that died or left is
  // no longer waited for.
  LeaseStatus Wait(double wait_s, bool* skipped);
  LeaseStatus Done();   // this process's current turn is over (its allreduce returned)
  LeaseStatus Leave();  // stop turning (end of training); peers stop waiting for us
  LinkTurnStats Stats() const;
  std::vector<LinkTurnEvent> Timeline() const;
  const std::string& name() const;

  LinkTurn(const LinkTurn&) = delete;
  LinkTurn& operator=(const LinkTurn&) = delete;
  ~LinkTurn();

 private:
  friend class LeaseRegistry;
  explicit LinkTurn(std::shared_ptr<LeaseSegment> segment);

  LinkTurnEntry* Table() const;  // the segment's link turn table, indexed by position
  // Takes the segment's mutex and finds this process's entry; an error if it never joined or
  // a peer dropped it as dead (which only happens if our slot lock was lost).
  LeaseStatus MyEntry(SegmentLock* locked, int32_t* position);
  // The position of a live job whose next turn comes before `position`'s next turn, or -1.
  int Blocker(int32_t position) const;
  // For the registry's fork handlers: local state is held across fork().
  void LockForFork() { mu_.lock(); }
  void UnlockAfterFork() { mu_.unlock(); }

  const std::shared_ptr<LeaseSegment> segment_;
  mutable std::mutex mu_;  // guards what follows; never held while waiting for a turn
  int32_t position_ = -1;  // this process's position, -1: not joined
  LinkTurnStats stats_;
  std::unique_ptr<EventRing<LinkTurnEvent>> events_;
};

}  // namespace crossover

#endif  // CROSSOVER_TF_OPS_CORE_LINK_TURN_H_
