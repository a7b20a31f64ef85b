// Registers the TensorFlow ops of the device lease and the link turn: names, attrs, shapes
// and docs only (tensorflow/custom-op style); their kernels are in lease_kernels.cc. The op
// names are what crossover_tf/lease loads by, so they never change.
#include "core/device_lease.h"
#include "core/link_turn.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace crossover {
namespace {

using ::tensorflow::shape_inference::InferenceContext;

absl::Status PassThroughShapes(InferenceContext* c) {
  for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
  return absl::OkStatus();
}

}  // namespace

// Every op names its lease (group, device_key, and the segment's directory: "" is /dev/shm),
// says how the segment is shared (shared_group) and who this process is on it (job: "" is
// "<host>:<pid>"), and is stateful, so grappler never prunes, dedups or reorders it.
#define LEASE_OP(name)                                                             \
  REGISTER_OP(name)                                                                \
      .Attr("group: string")                                                       \
      .Attr("device_key: string")                                                  \
      .Attr("lease_dir: string = ''")                                              \
      .Attr("shared_group: bool = false")                                          \
      .Attr("job: string = ''")                                                    \
      .SetIsStateful()

LEASE_OP("CrossoverAcquireLease")
    .Input("inputs: T")
    .Output("outputs: T")
    .Attr("T: list(type) >= 0")
    .Attr("timeout_seconds: float = 600")
    .Attr("tag: int = 0")
    .Attr("priority: int = 1")
    .SetShapeFn(PassThroughShapes)
    .Doc(R"doc(
Blocks until this process holds the device lease named by group and device_key, then passes
its inputs through. Fails with DEADLINE_EXCEEDED (naming the holder's pid) after timeout_seconds.
tag labels the acquisition in the lease timeline (e.g. 1 = compute, 2 = apply). priority is the
waiter's class (0 secondary, 1 normal, 2 primary): classes queue in that order, FIFO within one.
)doc");

LEASE_OP("CrossoverYieldLease")
    .Input("inputs: T")
    .Output("outputs: T")
    .Attr("T: list(type) >= 0")
    .Attr("reserve_seconds: float = 0")
    .SetShapeFn(PassThroughShapes)
    .Doc(R"doc(
Yields the device lease (if held) once its inputs exist and, on GPU, once the compute stream
has drained; passes the inputs through. A waiting peer gets the device next, unless
reserve_seconds > 0: then waiters of a lower priority class than this process's hold stay out
for that long, or until this process acquires again.
)doc");

template <size_t kFields>
absl::Status NamedValuesShape(InferenceContext* c) {
  c->set_output(0, c->Vector(kFields));
  c->set_output(1, c->Vector(kFields));
  return absl::OkStatus();
}

LEASE_OP("CrossoverLeaseStats")
    .Output("stats: float64")
    .Output("names: string")
    .SetShapeFn(NamedValuesShape<sizeof(kLeaseStatsFields) / sizeof(kLeaseStatsFields[0])>)
    .Doc(R"doc(
This process's lease statistics and, in the same order, their names (acquires, handoffs,
contended, recoveries, wait_s, hold_s, max_wait_s, max_hold_s, held).
)doc");

LEASE_OP("CrossoverLinkTurnStats")
    .Output("stats: float64")
    .Output("names: string")
    .SetShapeFn(NamedValuesShape<sizeof(kLinkTurnStatsFields) / sizeof(kLinkTurnStatsFields[0])>)
    .Doc(R"doc(
This process's link turn statistics and their names (turns, waited, skipped, wait_s,
max_wait_s).
)doc");

LEASE_OP("CrossoverLinkTurnJoin")
    .Output("next_index: int64")
    .Attr("position: int")
    .Attr("jobs: int")
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Registers this process as job `position` of `jobs` in the group's link turn order on this
host; returns the next turn index of the jobs already turning here. Start with
CrossoverLinkTurnStart once the job's ranks agreed on an offset.
)doc");

LEASE_OP("CrossoverLinkTurnStart")
    .Input("offset: int64")
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Starts taking link turns: this job's allreduce k is global turn offset + k.
)doc");

LEASE_OP("CrossoverLinkTurnLeave")
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Stops taking link turns until the job joins again (at every validation and epoch end, where
the job stops stepping for a while, and at the end of training): the other jobs no longer
wait for this one.
)doc");

LEASE_OP("CrossoverLinkTurnWait")
    .Input("inputs: T")
    .Output("outputs: T")
    .Attr("T: list(type) >= 0")
    .Attr("wait_seconds: float = 10")
    .SetShapeFn(PassThroughShapes)
    .Doc(R"doc(
Waits until the other jobs' earlier allreduces on this host are done (or wait_seconds pass, or
they die or leave), then passes its inputs through: put it between the gradients and their
allreduce. Never holds anything while it waits.
)doc");

LEASE_OP("CrossoverLinkTurnDone")
    .Input("inputs: T")
    .Output("outputs: T")
    .Attr("T: list(type) >= 0")
    .SetShapeFn(PassThroughShapes)
    .Doc(R"doc(
Marks this job's current link turn done once its inputs (the allreduced gradients) exist.
)doc");

LEASE_OP("CrossoverLeaseRegister")
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Makes this process a member of the lease (claims its slot, with its job label) now rather
than at its first acquire. Idempotent; never holds the device.
)doc");

// The same outputs as CrossoverLeaseInspect: [pid, pid_ns, holding] and [pid, pid_ns,
// priority, since_ns] rows with their job labels, and since when the holder holds.
absl::Status SnapshotShapes(InferenceContext* c) {
  c->set_output(0, c->Matrix(c->UnknownDim(), 3));
  c->set_output(1, c->Vector(c->UnknownDim()));
  c->set_output(2, c->Matrix(c->UnknownDim(), 4));
  c->set_output(3, c->Vector(c->UnknownDim()));
  c->set_output(4, c->Scalar());
  return absl::OkStatus();
}

LEASE_OP("CrossoverLeaseMembers")
    .Output("members: int64")
    .Output("member_jobs: string")
    .Output("waiters: int64")
    .Output("waiter_jobs: string")
    .Output("held_since_ns: int64")
    .SetShapeFn(SnapshotShapes)
    .Doc(R"doc(
Who is on the lease this process is a member of (it registers first), read from the segment it
has mapped, never from a file looked up again by name: the group's join check reads this. Fails
(FAILED_PRECONDITION) if the segment's name no longer refers to that segment (renamed or
replaced while in use). Outputs as CrossoverLeaseInspect's. Never holds the device.
)doc");

REGISTER_OP("CrossoverLeaseInspect")
    .Input("path: string")
    .Output("members: int64")
    .Output("member_jobs: string")
    .Output("waiters: int64")
    .Output("waiter_jobs: string")
    .Output("held_since_ns: int64")
    .Attr("bound_seconds: float = 2")
    .SetIsStateful()
    .SetShapeFn(SnapshotShapes)
    .Doc(R"doc(
Who is on the lease segment file at `path`, read without becoming a member and without ever
waiting on it. The directory and the file must pass the observer's trust rule; the file is
opened read-only and non-blocking and copied, never mapped or locked (no slot, no creation, no
repair; bound_seconds bounds the retries for a consistent copy). Outputs: the live members
[pid, pid_ns, holding] and their job labels, the waiting threads in queue order
[pid, pid_ns, priority, since_ns] and their job labels, and since when the holder holds
(CLOCK_REALTIME ns; 0: free). Never holds the device.
)doc");

absl::Status EventMatrixShape(InferenceContext* c) {
  c->set_output(0, c->Matrix(c->UnknownDim(), 4));
  return absl::OkStatus();
}

LEASE_OP("CrossoverLeaseTimeline")
    .Output("events: int64")
    .SetShapeFn(EventMatrixShape)
    .Doc(R"doc(
This process's recent lease events, oldest first: [request_ns, acquired_ns, yielded_ns, tag]
in CLOCK_REALTIME nanoseconds (yielded_ns = 0 while held).
)doc");

LEASE_OP("CrossoverLinkTurnTimeline")
    .Output("events: int64")
    .SetShapeFn(EventMatrixShape)
    .Doc(R"doc(
This process's recent link turns, oldest first: [request_ns, start_ns, done_ns, skipped] in
CLOCK_REALTIME nanoseconds (done_ns = 0 while the turn's allreduce runs; skipped = 1 when the
turn began because the wait bound passed).
)doc");

}  // namespace crossover
