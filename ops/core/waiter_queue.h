// The device lease's FIFO of waiting threads, as it lives in the shared segment. Kept apart
// from the lease so that its repair (it may be left half-updated by a process that died inside
// the critical section) is tested on its own.
#ifndef CROSSOVER_TF_OPS_CORE_WAITER_QUEUE_H_
#define CROSSOVER_TF_OPS_CORE_WAITER_QUEUE_H_

#include <cstdint>
#include <functional>

#include "core/lease_liveness.h"
#include "core/lease_types.h"

namespace crossover {

struct Waiter {
  Owner who;
  uint64_t ticket = 0;
  int64_t since_wall_ns = 0;
  int32_t priority = kNormal;
  // When the waiter gives up, on the host's CLOCK_MONOTONIC (HostMonoNs: one clock for every
  // member, whatever its time namespace). Past it the entry stands for nobody: its owner times
  // out as soon as it runs again.
  int64_t deadline_host_mono_ns = 0;
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
  // deadline is before now_host_mono_ns; returns how many entries it dropped.
  int Repair(const std::function<bool(const Owner&)>& alive, int64_t now_host_mono_ns);
};

}  // namespace crossover

#endif  // CROSSOVER_TF_OPS_CORE_WAITER_QUEUE_H_
