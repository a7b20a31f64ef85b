// The process-wide registry of open lease segments: one LeaseSegment per segment path, with
// its DeviceLease and LinkTurn, so that both classes of one (dir, group, device_key) share one
// mapping and one membership. It also keeps them consistent across fork(). Private to the core.
#ifndef CROSSOVER_TF_OPS_CORE_LEASE_REGISTRY_H_
#define CROSSOVER_TF_OPS_CORE_LEASE_REGISTRY_H_

#include <memory>
#include <string>

#include "core/lease_types.h"

namespace crossover {

class DeviceLease;
class LinkTurn;

class LeaseRegistry {
 public:
  // Hands out the device lease and/or link turn (either out may be null) of (group,
  // device_key) in location.dir, opening or creating the segment on first use. An open segment
  // keeps the ownership rule it was opened with, and stays open until the process exits: a
  // process stays a member of every segment it joined. The TF kernels that reference a lease
  // come and go (tf.random.set_seed clears the eager kernel cache), and a member that vanished
  // meanwhile would fail its peers' join check while it waits for them at a barrier. At exit,
  // the last member of a segment removes it (RemoveSegmentsLeftLast).
  static LeaseStatus Open(const std::string& group, const std::string& device_key,
                          const SegmentLocation& location, std::shared_ptr<DeviceLease>* lease,
                          std::shared_ptr<LinkTurn>* link_turn);

 private:
  // fork(): the child must not keep its parent's slot lock alive (it would make a dead parent
  // look alive) nor believe it holds its parent's lease.
  static void PrepareFork();
  static void ParentAfterFork();
  static void ChildAfterFork();
  static void AfterFork(bool child);
  // At exit: removes each open segment that no other process is live on.
  static void RemoveSegmentsLeftLast();
};

}  // namespace crossover

#endif  // CROSSOVER_TF_OPS_CORE_LEASE_REGISTRY_H_
