// TensorFlow ops around the cross-process device lease (device_lease.h).
//
// Acquire and yield take the tensors they must run after and pass them through unchanged
// (forwarding buffers, no copies), so graph data flow expresses "after the gradients exist"
// and "before the optimizer update". Both are stateful so grappler never prunes, dedups or
// reorders them.
#include <array>
#include <memory>
#include <string>

#include "device_lease.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "xla/stream_executor/stream.h"

namespace crossover {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::DEVICE_GPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::shape_inference::InferenceContext;

absl::Status ToTf(const LeaseStatus& s) {
  switch (s.code) {
    case LeaseCode::kOk:
      return absl::OkStatus();
    case LeaseCode::kInvalidArgument:
      return absl::InvalidArgumentError(s.message);
    case LeaseCode::kDeadlineExceeded:
      return absl::DeadlineExceededError(s.message);
    case LeaseCode::kResourceExhausted:
      return absl::ResourceExhaustedError(s.message);
    case LeaseCode::kPermissionDenied:
      return absl::PermissionDeniedError(s.message);
    case LeaseCode::kInternal:
      break;
  }
  return absl::InternalError(s.message);
}

absl::Status PassThroughShapes(InferenceContext* c) {
  for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
  return absl::OkStatus();
}

// Reads a float attr and checks it with the core's own rule, so a bad value fails when the
// graph is instantiated rather than mid-training.
void GetCheckedAttr(OpKernelConstruction* ctx, const char* name, float* value,
                    LeaseStatus (*check)(double)) {
  OP_REQUIRES_OK(ctx, ctx->GetAttr(name, value));
  OP_REQUIRES_OK(ctx, ToTf(check(*value)));
}

// Resolves the lease named by the kernel's attrs (group, device_key, lease_dir, shared_group,
// job) at construction, so a bad name or directory fails when the graph is instantiated rather
// than mid-training. Opening the lease makes this process a member.
class LeaseKernel : public OpKernel {
 public:
  explicit LeaseKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string group, device_key;
    LeaseOptions options;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("group", &group));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("device_key", &device_key));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("lease_dir", &options.dir));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shared_group", &options.shared_group));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("job", &options.job));
    OP_REQUIRES_OK(ctx, ToTf(DeviceLease::Get(group, device_key, &lease_, options)));
  }

 protected:
  void ForwardInputs(OpKernelContext* ctx) {
    for (int i = 0; i < ctx->num_inputs(); ++i) ctx->set_output(i, ctx->input(i));
  }
  std::shared_ptr<DeviceLease> lease_;
};

class AcquireLeaseOp : public LeaseKernel {
 public:
  explicit AcquireLeaseOp(OpKernelConstruction* ctx) : LeaseKernel(ctx) {
    GetCheckedAttr(ctx, "timeout_seconds", &timeout_s_, DeviceLease::ValidateTimeout);
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tag", &tag_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("priority", &priority_));
    OP_REQUIRES_OK(ctx, ToTf(DeviceLease::ValidatePriority(priority_)));
  }
  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, ToTf(lease_->Acquire(timeout_s_, tag_, priority_)));
    ForwardInputs(ctx);
  }

 private:
  float timeout_s_ = 0;
  int64_t tag_ = 0;
  int64_t priority_ = kNormal;
};

// kWaitForStream: on GPU, kernels are only enqueued when an op "finishes"; releasing the lease
// then would let the peer start while our kernels still run, so block on the stream first.
// The lease is released even when that wait fails, and the wait's error is the one reported.
template <bool kWaitForStream>
class YieldLeaseOp : public LeaseKernel {
 public:
  explicit YieldLeaseOp(OpKernelConstruction* ctx) : LeaseKernel(ctx) {
    GetCheckedAttr(ctx, "reserve_seconds", &reserve_s_, DeviceLease::ValidateReserve);
  }
  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, ToTf(lease_->ReleaseAfter([ctx]() -> LeaseStatus {
      if (!kWaitForStream || ctx->op_device_context() == nullptr ||
          ctx->op_device_context()->stream() == nullptr) {
        return LeaseStatus::Ok();
      }
      const absl::Status waited = ctx->op_device_context()->stream()->BlockHostUntilDone();
      if (waited.ok()) return LeaseStatus::Ok();
      return LeaseStatus::Error(LeaseCode::kInternal,
                                "waiting for the device stream before yielding the lease: " +
                                    std::string(waited.message()));
    }, reserve_s_)));
    ForwardInputs(ctx);
  }

 private:
  float reserve_s_ = 0;
};

// Writes values and, in the same order, their names to outputs 0 and 1.
void OutputNamedValues(OpKernelContext* ctx, const std::vector<double>& values,
                       const char* const* names) {
  const int64_t n = static_cast<int64_t>(values.size());
  Tensor* out = nullptr;
  Tensor* names_out = nullptr;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &out));
  OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &names_out));
  for (int64_t i = 0; i < n; ++i) {
    out->flat<double>()(i) = values[i];
    names_out->flat<tensorflow::tstring>()(i) = names[i];
  }
}

class LeaseStatsOp : public LeaseKernel {
 public:
  using LeaseKernel::LeaseKernel;
  void Compute(OpKernelContext* ctx) override {
    OutputNamedValues(ctx, lease_->Stats().Values(), kLeaseStatsFields);
  }
};

class TurnStatsOp : public LeaseKernel {
 public:
  using LeaseKernel::LeaseKernel;
  void Compute(OpKernelContext* ctx) override {
    OutputNamedValues(ctx, lease_->GetTurnStats().Values(), kTurnStatsFields);
  }
};

class TurnJoinOp : public LeaseKernel {
 public:
  explicit TurnJoinOp(OpKernelConstruction* ctx) : LeaseKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("position", &position_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("jobs", &jobs_));
    OP_REQUIRES_OK(ctx, ToTf(DeviceLease::ValidateTurn(position_, jobs_)));
  }
  void Compute(OpKernelContext* ctx) override {
    int64_t next = 0;
    OP_REQUIRES_OK(ctx, ToTf(lease_->TurnJoin(position_, jobs_, &next)));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = next;
  }

 private:
  int64_t position_ = 0, jobs_ = 0;
};

class TurnStartOp : public LeaseKernel {
 public:
  using LeaseKernel::LeaseKernel;
  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, ToTf(lease_->TurnStart(ctx->input(0).scalar<int64_t>()())));
  }
};

class TurnLeaveOp : public LeaseKernel {
 public:
  using LeaseKernel::LeaseKernel;
  void Compute(OpKernelContext* ctx) override { OP_REQUIRES_OK(ctx, ToTf(lease_->TurnLeave())); }
};

class TurnWaitOp : public LeaseKernel {
 public:
  explicit TurnWaitOp(OpKernelConstruction* ctx) : LeaseKernel(ctx) {
    GetCheckedAttr(ctx, "wait_seconds", &wait_s_, DeviceLease::ValidateTimeout);
  }
  void Compute(OpKernelContext* ctx) override {
    bool skipped = false;  // counted in the turn stats
    OP_REQUIRES_OK(ctx, ToTf(lease_->TurnWait(wait_s_, &skipped)));
    ForwardInputs(ctx);
  }

 private:
  float wait_s_ = 0;
};

class TurnDoneOp : public LeaseKernel {
 public:
  using LeaseKernel::LeaseKernel;
  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, ToTf(lease_->TurnDone()));
    ForwardInputs(ctx);
  }
};

class RegisterLeaseOp : public LeaseKernel {
 public:
  using LeaseKernel::LeaseKernel;
  void Compute(OpKernelContext* ctx) override { OP_REQUIRES_OK(ctx, ToTf(lease_->Register())); }
};

// Writes rows as an [n, kColumns] int64 matrix to output `index`, and their job labels to
// output `index + 1`.
template <size_t kColumns, typename Item>
void OutputRows(OpKernelContext* ctx, int index, const std::vector<Item>& items,
                std::array<int64_t, kColumns> (*row)(const Item&)) {
  const int64_t n = static_cast<int64_t>(items.size());
  Tensor* rows = nullptr;
  Tensor* jobs = nullptr;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(index, TensorShape({n, kColumns}), &rows));
  OP_REQUIRES_OK(ctx, ctx->allocate_output(index + 1, TensorShape({n}), &jobs));
  auto m = rows->matrix<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const std::array<int64_t, kColumns> values = row(items[i]);
    for (size_t j = 0; j < kColumns; ++j) m(i, j) = values[j];
    jobs->flat<tensorflow::tstring>()(i) = items[i].job;
  }
}

std::array<int64_t, 3> MemberRow(const LeaseMember& m) {
  return {m.pid, static_cast<int64_t>(m.pid_ns), m.holding ? 1 : 0};
}
std::array<int64_t, 4> WaiterRow(const LeaseWaiter& w) {
  return {w.pid, static_cast<int64_t>(w.pid_ns), w.priority, w.since_wall_ns};
}

// Reads a segment file as an observer (DeviceLease::Inspect): never a member, never creating.
class InspectLeaseOp : public OpKernel {
 public:
  explicit InspectLeaseOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bound_seconds", &bound_s_));
  }
  void Compute(OpKernelContext* ctx) override {
    LeaseSnapshot snap;
    const std::string path(ctx->input(0).scalar<tensorflow::tstring>()());
    OP_REQUIRES_OK(ctx, ToTf(DeviceLease::Inspect(path, bound_s_, &snap)));
    OutputRows<3>(ctx, 0, snap.members, MemberRow);
    OutputRows<4>(ctx, 2, snap.queue, WaiterRow);
    Tensor* held_since = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({}), &held_since));
    held_since->scalar<int64_t>()() = snap.held_since_wall_ns;
  }

 private:
  float bound_s_ = 2;
};

// Writes events as an [n, 4] int64 matrix of their Row()s, oldest first.
template <typename Event>
void OutputEvents(OpKernelContext* ctx, const std::vector<Event>& events) {
  Tensor* out = nullptr;
  const int64_t n = static_cast<int64_t>(events.size());
  OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, 4}), &out));
  auto m = out->matrix<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const std::array<int64_t, 4> row = events[i].Row();
    for (int j = 0; j < 4; ++j) m(i, j) = row[j];
  }
}

class LeaseTimelineOp : public LeaseKernel {
 public:
  using LeaseKernel::LeaseKernel;
  void Compute(OpKernelContext* ctx) override { OutputEvents(ctx, lease_->Timeline()); }
};

class TurnTimelineOp : public LeaseKernel {
 public:
  using LeaseKernel::LeaseKernel;
  void Compute(OpKernelContext* ctx) override { OutputEvents(ctx, lease_->TurnTimeline()); }
};

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
Releases the device lease (if held) once its inputs exist and, on GPU, once the compute stream
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
    .SetShapeFn(NamedValuesShape<sizeof(kTurnStatsFields) / sizeof(kTurnStatsFields[0])>)
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
Stops taking link turns (end of training): the other jobs no longer wait for this one.
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

REGISTER_OP("CrossoverLeaseInspect")
    .Input("path: string")
    .Output("members: int64")
    .Output("member_jobs: string")
    .Output("waiters: int64")
    .Output("waiter_jobs: string")
    .Output("held_since_ns: int64")
    .Attr("bound_seconds: float = 2")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Matrix(c->UnknownDim(), 3));
      c->set_output(1, c->Vector(c->UnknownDim()));
      c->set_output(2, c->Matrix(c->UnknownDim(), 4));
      c->set_output(3, c->Vector(c->UnknownDim()));
      c->set_output(4, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Who is on the lease segment file at `path`, read without becoming a member (no slot, no
creation, no repair; the internal mutex is waited for at most bound_seconds): the live members
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
This process's recent lease events, oldest first: [request_ns, acquired_ns, released_ns, tag]
in CLOCK_REALTIME nanoseconds (released_ns = 0 while held).
)doc");

LEASE_OP("CrossoverLinkTurnTimeline")
    .Output("events: int64")
    .SetShapeFn(EventMatrixShape)
    .Doc(R"doc(
This process's recent link turns, oldest first: [request_ns, start_ns, done_ns, skipped] in
CLOCK_REALTIME nanoseconds (done_ns = 0 while the turn's allreduce runs; skipped = 1 when the
turn began because the wait bound passed).
)doc");

REGISTER_KERNEL_BUILDER(Name("CrossoverAcquireLease").Device(DEVICE_CPU), AcquireLeaseOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverYieldLease").Device(DEVICE_CPU), YieldLeaseOp<false>);
REGISTER_KERNEL_BUILDER(Name("CrossoverLeaseStats").Device(DEVICE_CPU), LeaseStatsOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLeaseTimeline").Device(DEVICE_CPU), LeaseTimelineOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLinkTurnStats").Device(DEVICE_CPU), TurnStatsOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLinkTurnTimeline").Device(DEVICE_CPU), TurnTimelineOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLinkTurnJoin").Device(DEVICE_CPU), TurnJoinOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLinkTurnStart").Device(DEVICE_CPU), TurnStartOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLinkTurnLeave").Device(DEVICE_CPU), TurnLeaveOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLinkTurnWait").Device(DEVICE_CPU), TurnWaitOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLinkTurnDone").Device(DEVICE_CPU), TurnDoneOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLeaseRegister").Device(DEVICE_CPU), RegisterLeaseOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLeaseInspect").Device(DEVICE_CPU), InspectLeaseOp);

// GPU: the pass-through tensors stay in device memory (forwarded, never copied); only the
// lease bookkeeping runs on the host. Stats, timeline, join, start and leave are host-only.
REGISTER_KERNEL_BUILDER(Name("CrossoverAcquireLease").Device(DEVICE_GPU), AcquireLeaseOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverYieldLease").Device(DEVICE_GPU), YieldLeaseOp<true>);
REGISTER_KERNEL_BUILDER(Name("CrossoverLinkTurnWait").Device(DEVICE_GPU), TurnWaitOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLinkTurnDone").Device(DEVICE_GPU), TurnDoneOp);

}  // namespace crossover
