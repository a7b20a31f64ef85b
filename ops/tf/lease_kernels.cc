// The OpKernels of the ops that lease_ops.cc registers: each wraps one call of the lease core
// (DeviceLease, device_lease.h) or of the link turn (LinkTurn, link_turn.h).
//
// Acquire and yield take the tensors they must run after and pass them through unchanged
// (forwarding buffers, no copies), so graph data flow expresses "after the gradients exist"
// and "before the optimizer update". Every op is stateful (lease_ops.cc) so grappler never
// prunes, dedups or reorders them.
#include <array>
#include <memory>
#include <string>

#include "core/device_lease.h"
#include "core/link_turn.h"
#include "tensorflow/core/framework/op_kernel.h"
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
    case LeaseCode::kFailedPrecondition:
      return absl::FailedPreconditionError(s.message);
    case LeaseCode::kInternal:
      break;
  }
  return absl::InternalError(s.message);
}

// Reads a float attr and checks it with the core's own rule, so a bad value fails when the
// graph is instantiated rather than mid-training.
void GetCheckedAttr(OpKernelConstruction* ctx, const char* name, float* value,
                    LeaseStatus (*check)(double)) {
  OP_REQUIRES_OK(ctx, ctx->GetAttr(name, value));
  OP_REQUIRES_OK(ctx, ToTf(check(*value)));
}

// Resolves the segment named by the kernel's attrs (group, device_key, lease_dir,
// shared_group, job) at construction, so a bad name or directory fails when the graph is
// instantiated rather than mid-training. Opening it makes this process a member. Core is
// DeviceLease or LinkTurn.
template <typename Core>
class SegmentKernel : public OpKernel {
 public:
  explicit SegmentKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string group, device_key;
    SegmentLocation location;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("group", &group));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("device_key", &device_key));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("lease_dir", &location.dir));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shared_group", &location.shared_group));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("job", &location.job));
    OP_REQUIRES_OK(ctx, ToTf(Core::Get(group, device_key, &core_, location)));
  }

 protected:
  void ForwardInputs(OpKernelContext* ctx) {
    for (int i = 0; i < ctx->num_inputs(); ++i) ctx->set_output(i, ctx->input(i));
  }
  std::shared_ptr<Core> core_;
};
using LeaseKernel = SegmentKernel<DeviceLease>;
using LinkTurnKernel = SegmentKernel<LinkTurn>;

class AcquireLeaseOp : public LeaseKernel {
 public:
  explicit AcquireLeaseOp(OpKernelConstruction* ctx) : LeaseKernel(ctx) {
    GetCheckedAttr(ctx, "timeout_seconds", &timeout_s_, DeviceLease::ValidateTimeout);
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tag", &tag_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("priority", &priority_));
    OP_REQUIRES_OK(ctx, ToTf(DeviceLease::ValidatePriority(priority_)));
  }
  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, ToTf(core_->Acquire(timeout_s_, tag_, priority_)));
    ForwardInputs(ctx);
  }

 private:
  float timeout_s_ = 0;
  int64_t tag_ = 0;
  int64_t priority_ = kNormal;
};

// kWaitForStream: on GPU, kernels are only enqueued when an op "finishes"; yielding the lease
// then would let the peer start while our kernels still run, so block on the stream first.
// The lease is yielded even when that wait fails, and the wait's error is the one reported.
template <bool kWaitForStream>
class YieldLeaseOp : public LeaseKernel {
 public:
  explicit YieldLeaseOp(OpKernelConstruction* ctx) : LeaseKernel(ctx) {
    GetCheckedAttr(ctx, "reserve_seconds", &reserve_s_, DeviceLease::ValidateReserve);
  }
  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, ToTf(core_->YieldAfter([ctx]() -> LeaseStatus {
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
    OutputNamedValues(ctx, core_->Stats().Values(), kLeaseStatsFields);
  }
};

class LinkTurnStatsOp : public LinkTurnKernel {
 public:
  using LinkTurnKernel::LinkTurnKernel;
  void Compute(OpKernelContext* ctx) override {
    OutputNamedValues(ctx, core_->Stats().Values(), kLinkTurnStatsFields);
  }
};

class LinkTurnJoinOp : public LinkTurnKernel {
 public:
  explicit LinkTurnJoinOp(OpKernelConstruction* ctx) : LinkTurnKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("position", &position_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("jobs", &jobs_));
    OP_REQUIRES_OK(ctx, ToTf(LinkTurn::ValidatePosition(position_, jobs_)));
  }
  void Compute(OpKernelContext* ctx) override {
    int64_t next = 0;
    OP_REQUIRES_OK(ctx, ToTf(core_->Join(position_, jobs_, &next)));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = next;
  }

 private:
  int64_t position_ = 0, jobs_ = 0;
};

class LinkTurnStartOp : public LinkTurnKernel {
 public:
  using LinkTurnKernel::LinkTurnKernel;
  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, ToTf(core_->Start(ctx->input(0).scalar<int64_t>()())));
  }
};

class LinkTurnLeaveOp : public LinkTurnKernel {
 public:
  using LinkTurnKernel::LinkTurnKernel;
  void Compute(OpKernelContext* ctx) override { OP_REQUIRES_OK(ctx, ToTf(core_->Leave())); }
};

class LinkTurnWaitOp : public LinkTurnKernel {
 public:
  explicit LinkTurnWaitOp(OpKernelConstruction* ctx) : LinkTurnKernel(ctx) {
    GetCheckedAttr(ctx, "wait_seconds", &wait_s_, DeviceLease::ValidateTimeout);
  }
  void Compute(OpKernelContext* ctx) override {
    bool skipped = false;  // counted in the turn stats
    OP_REQUIRES_OK(ctx, ToTf(core_->Wait(wait_s_, &skipped)));
    ForwardInputs(ctx);
  }

 private:
  float wait_s_ = 0;
};

class LinkTurnDoneOp : public LinkTurnKernel {
 public:
  using LinkTurnKernel::LinkTurnKernel;
  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, ToTf(core_->Done()));
    ForwardInputs(ctx);
  }
};

class RegisterLeaseOp : public LeaseKernel {
 public:
  using LeaseKernel::LeaseKernel;
  void Compute(OpKernelContext* ctx) override { OP_REQUIRES_OK(ctx, ToTf(core_->Register())); }
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

// Writes a snapshot as the five outputs CrossoverLeaseMembers and CrossoverLeaseInspect share.
void OutputSnapshot(OpKernelContext* ctx, const LeaseSnapshot& snap) {
  OutputRows<3>(ctx, 0, snap.members, MemberRow);
  OutputRows<4>(ctx, 2, snap.queue, WaiterRow);
  Tensor* held_since = nullptr;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({}), &held_since));
  held_since->scalar<int64_t>()() = snap.held_since_wall_ns;
}

// Reads the segment this process has mapped (DeviceLease::Members): the join check's source.
class LeaseMembersOp : public LeaseKernel {
 public:
  using LeaseKernel::LeaseKernel;
  void Compute(OpKernelContext* ctx) override {
    LeaseSnapshot snap;
    OP_REQUIRES_OK(ctx, ToTf(core_->Members(&snap)));
    OutputSnapshot(ctx, snap);
  }
};

// Reads a segment file as an observer (DeviceLease::Inspect): never a member, never creating,
// never blocking.
class InspectLeaseOp : public OpKernel {
 public:
  explicit InspectLeaseOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bound_seconds", &bound_s_));
  }
  void Compute(OpKernelContext* ctx) override {
    LeaseSnapshot snap;
    const std::string path(ctx->input(0).scalar<tensorflow::tstring>()());
    OP_REQUIRES_OK(ctx, ToTf(DeviceLease::Inspect(path, bound_s_, &snap)));
    OutputSnapshot(ctx, snap);
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
  void Compute(OpKernelContext* ctx) override { OutputEvents(ctx, core_->Timeline()); }
};

class LinkTurnTimelineOp : public LinkTurnKernel {
 public:
  using LinkTurnKernel::LinkTurnKernel;
  void Compute(OpKernelContext* ctx) override { OutputEvents(ctx, core_->Timeline()); }
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("CrossoverAcquireLease").Device(DEVICE_CPU), AcquireLeaseOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverYieldLease").Device(DEVICE_CPU), YieldLeaseOp<false>);
REGISTER_KERNEL_BUILDER(Name("CrossoverLeaseStats").Device(DEVICE_CPU), LeaseStatsOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLeaseTimeline").Device(DEVICE_CPU), LeaseTimelineOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLinkTurnStats").Device(DEVICE_CPU), LinkTurnStatsOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLinkTurnTimeline").Device(DEVICE_CPU), LinkTurnTimelineOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLinkTurnJoin").Device(DEVICE_CPU), LinkTurnJoinOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLinkTurnStart").Device(DEVICE_CPU), LinkTurnStartOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLinkTurnLeave").Device(DEVICE_CPU), LinkTurnLeaveOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLinkTurnWait").Device(DEVICE_CPU), LinkTurnWaitOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLinkTurnDone").Device(DEVICE_CPU), LinkTurnDoneOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLeaseRegister").Device(DEVICE_CPU), RegisterLeaseOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLeaseInspect").Device(DEVICE_CPU), InspectLeaseOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLeaseMembers").Device(DEVICE_CPU), LeaseMembersOp);

// GPU: the pass-through tensors stay in device memory (forwarded, never copied); only the
// lease bookkeeping runs on the host. Stats, timeline, join, start and leave are host-only.
REGISTER_KERNEL_BUILDER(Name("CrossoverAcquireLease").Device(DEVICE_GPU), AcquireLeaseOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverYieldLease").Device(DEVICE_GPU), YieldLeaseOp<true>);
REGISTER_KERNEL_BUILDER(Name("CrossoverLinkTurnWait").Device(DEVICE_GPU), LinkTurnWaitOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLinkTurnDone").Device(DEVICE_GPU), LinkTurnDoneOp);

}  // namespace crossover
