// The test hooks of lease_test_hooks.h: they reach into the segment the way no caller can.
#include "testing/lease_test_hooks.h"

#include <unistd.h>

#include "core/lease_segment.h"

namespace crossover {

void LeaseTestHooks::LockInternal(DeviceLease& lease) {
  SharedLease* s = lease.segment_->shared();
  pthread_mutex_lock(&s->mu);
  s->locker_pid.store(getpid());
}
void LeaseTestHooks::SetInitDelayMs(int ms) { SetSegmentInitDelayMs(ms); }
WaiterQueue& LeaseTestHooks::Queue(DeviceLease& lease) { return lease.segment_->shared()->queue; }
void LeaseTestHooks::StepChangeSeq(DeviceLease& lease) {
  lease.segment_->shared()->change_seq.fetch_add(1);
}
void LeaseTestHooks::MarkInside(DeviceLease& lease, uint64_t nonce) {
  lease.segment_->shared()->inside.store(nonce);
}

}  // namespace crossover
