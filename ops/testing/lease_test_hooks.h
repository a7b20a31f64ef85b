// Hooks for device_lease_test.cc only: they let a test create the rare states (a process
// stopped or dead inside the critical section, a creator that stalls, a half-updated queue)
// that the lease must survive. Linked into the test binaries only (device_lease_test and the
// lease_cli builds: ops/Makefile, ops/BUILD), never into _lease_ops.so, _lease_observer.so or
// gpu_probe.
#ifndef CROSSOVER_TF_OPS_TESTING_LEASE_TEST_HOOKS_H_
#define CROSSOVER_TF_OPS_TESTING_LEASE_TEST_HOOKS_H_

#include "core/device_lease.h"
#include "core/waiter_queue.h"

namespace crossover {

struct LeaseTestHooks {
  // Takes the lease's internal mutex and never releases it (the caller then stops or exits).
  static void LockInternal(DeviceLease& lease);
  // Makes segment creation pause this long between sizing and initialising the segment.
  static void SetInitDelayMs(int ms);
  static WaiterQueue& Queue(DeviceLease& lease);
  // Marks the segment as if the process of `nonce` were inside a hold (the overlapping-hold
  // check's word) while the holder field says otherwise: a broken exclusion, made on purpose.
  static void MarkInside(DeviceLease& lease, uint64_t nonce);
  // Opens or closes an observed change (SharedLease::change_seq), as a member stopped in the
  // middle of one would leave it.
  static void StepChangeSeq(DeviceLease& lease);
};

}  // namespace crossover

#endif  // CROSSOVER_TF_OPS_TESTING_LEASE_TEST_HOOKS_H_
