// The registry of this process's open segments and its fork() handlers (see lease_registry.h).
#include "core/lease_registry.h"

#include <pthread.h>
#include <stdlib.h>

#include <map>
#include <mutex>
#include <vector>

#include "core/device_lease.h"
#include "core/lease_segment.h"
#include "core/link_turn.h"

namespace crossover {
namespace {

// What this process has open on one segment.
struct OpenedSegment {
  std::shared_ptr<LeaseSegment> segment;
  std::shared_ptr<DeviceLease> lease;
  std::shared_ptr<LinkTurn> link_turn;
};

std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}
// Keyed by segment path; never shrinks (see LeaseRegistry::Open).
std::map<std::string, OpenedSegment>& Registry() {
  static auto* registry = new std::map<std::string, OpenedSegment>();
  return *registry;
}
// The entries held across one fork(), from PrepareFork to the matching after-fork handler.
std::vector<OpenedSegment>& Forking() {
  static auto* forking = new std::vector<OpenedSegment>();
  return *forking;
}

}  // namespace

LeaseStatus LeaseRegistry::Open(const std::string& group, const std::string& device_key,
                                const SegmentLocation& location,
                                std::shared_ptr<DeviceLease>* lease,
                                std::shared_ptr<LinkTurn>* link_turn) {
  LeaseStatus status = DeviceLease::ValidateName(group, device_key);
  if (status.ok()) status = DeviceLease::ValidateJob(location.job);
  const std::string name = SegmentName(group, device_key);
  SegmentFile file;
  if (status.ok()) status = ResolveSegmentFile(location.dir, name, location.shared_group, &file);
  if (!status.ok()) return status;
  static std::once_flag process_handlers;
  std::call_once(process_handlers, [] {
    pthread_atfork(PrepareFork, ParentAfterFork, ChildAfterFork);
    atexit(RemoveSegmentsLeftLast);
  });
  std::vector<std::string> warnings;
  {
    std::lock_guard<std::mutex> registry_lock(RegistryMutex());
    OpenedSegment* entry = nullptr;
    if (auto found = Registry().find(file.path); found != Registry().end()) {
      entry = &found->second;
      status = entry->segment->AdoptJob(location.job);
    } else {
      std::shared_ptr<LeaseSegment> segment;
      status = LeaseSegment::Open(file, name, location.job, &segment, &warnings);
      if (status.ok()) {
        entry = &Registry()[file.path];
        entry->segment = segment;
        entry->lease.reset(new DeviceLease(segment));
        entry->link_turn.reset(new LinkTurn(segment));
      }
    }
    if (status.ok() && lease) *lease = entry->lease;
    if (status.ok() && link_turn) *link_turn = entry->link_turn;
  }
  for (const std::string& w : warnings) EmitWarning(w);
  return status;
}

// The last member out removes the segment, so that none outlives its group. A process that is
// killed cannot: the next group to use the name reuses the file, and the last out of that one
// removes it.
void LeaseRegistry::RemoveSegmentsLeftLast() {
  std::unique_lock<std::mutex> registry_lock(RegistryMutex(), std::try_to_lock);
  if (!registry_lock.owns_lock()) return;  // another thread is inside: never wait at exit
  for (auto& entry : Registry()) entry.second.segment->RemoveIfLast();
}

void LeaseRegistry::PrepareFork() {
  RegistryMutex().lock();
  for (auto& entry : Registry()) Forking().push_back(entry.second);
  for (OpenedSegment& entry : Forking()) {
    entry.lease->LockForFork();
    entry.link_turn->LockForFork();
    entry.segment->LockForFork();
  }
}

void LeaseRegistry::ParentAfterFork() { AfterFork(false); }
void LeaseRegistry::ChildAfterFork() { AfterFork(true); }

// In the child, each segment forgets its identity and the lease its hold (they were the
// parent's); either side then lets go of what PrepareFork took.
void LeaseRegistry::AfterFork(bool child) {
  for (OpenedSegment& entry : Forking()) {
    entry.segment->UnlockAfterFork(child);
    entry.link_turn->UnlockAfterFork();
    entry.lease->UnlockAfterFork(child);
  }
  Forking().clear();
  RegistryMutex().unlock();
}

}  // namespace crossover
