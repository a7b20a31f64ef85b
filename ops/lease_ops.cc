// TensorFlow ops around the cross-process device lease (device_lease.h).
//
// Acquire and yield take the tensors they must run after and pass them through unchanged
// (forwarding buffers, no copies), so graph data flow expresses "after the gradients exist"
// and "before the optimizer update". Both are stateful so grappler never prunes, dedups or
// reorders them.
#include <memory>
#include <string>

#include "device_lease.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
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

// Resolves the lease named by the kernel's group/device_key attrs at construction, so a bad
// name fails when the graph is instantiated rather than mid-training.
class LeaseKernel : public OpKernel {
 public:
  explicit LeaseKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string group, device_key;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("group", &group));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("device_key", &device_key));
    OP_REQUIRES_OK(ctx, ToTf(DeviceLease::Get(group, device_key, &lease_)));
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
    OP_REQUIRES_OK(ctx, ctx->GetAttr("timeout_seconds", &timeout_s_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tag", &tag_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("priority", &priority_));
    OP_REQUIRES_OK(ctx, ToTf(DeviceLease::ValidateTimeout(timeout_s_)));
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
    OP_REQUIRES_OK(ctx, ctx->GetAttr("reserve_seconds", &reserve_s_));
    OP_REQUIRES_OK(ctx, ToTf(DeviceLease::ValidateReserve(reserve_s_)));
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

class LeaseStatsOp : public LeaseKernel {
 public:
  using LeaseKernel::LeaseKernel;
  void Compute(OpKernelContext* ctx) override {
    const std::vector<double> values = lease_->Stats().Values();
    const int64_t n = static_cast<int64_t>(values.size());
    Tensor* out = nullptr;
    Tensor* names = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &names));
    for (int64_t i = 0; i < n; ++i) {
      out->flat<double>()(i) = values[i];
      names->flat<tensorflow::tstring>()(i) = kLeaseStatsFields[i];
    }
  }
};

class LeaseTimelineOp : public LeaseKernel {
 public:
  using LeaseKernel::LeaseKernel;
  void Compute(OpKernelContext* ctx) override {
    const std::vector<LeaseEvent> events = lease_->Timeline();
    Tensor* out = nullptr;
    const int64_t n = static_cast<int64_t>(events.size());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, 4}), &out));
    auto m = out->matrix<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      m(i, 0) = events[i].request_ns;
      m(i, 1) = events[i].acquired_ns;
      m(i, 2) = events[i].released_ns;
      m(i, 3) = events[i].tag;
    }
  }
};

}  // namespace

REGISTER_OP("CrossoverAcquireLease")
    .Input("inputs: T")
    .Output("outputs: T")
    .Attr("T: list(type) >= 0")
    .Attr("group: string")
    .Attr("device_key: string")
    .Attr("timeout_seconds: float = 600")
    .Attr("tag: int = 0")
    .Attr("priority: int = 1")
    .SetIsStateful()
    .SetShapeFn(PassThroughShapes)
    .Doc(R"doc(
Blocks until this process holds the device lease named by group and device_key, then passes
its inputs through. Fails with DEADLINE_EXCEEDED (naming the holder's pid) after timeout_seconds.
tag labels the acquisition in the lease timeline (e.g. 1 = compute, 2 = apply). priority is the
waiter's class (0 secondary, 1 normal, 2 primary): classes queue in that order, FIFO within one.
)doc");

REGISTER_OP("CrossoverYieldLease")
    .Input("inputs: T")
    .Output("outputs: T")
    .Attr("T: list(type) >= 0")
    .Attr("group: string")
    .Attr("device_key: string")
    .Attr("reserve_seconds: float = 0")
    .SetIsStateful()
    .SetShapeFn(PassThroughShapes)
    .Doc(R"doc(
Releases the device lease (if held) once its inputs exist and, on GPU, once the compute stream
has drained; passes the inputs through. A waiting peer gets the device next, unless
reserve_seconds > 0: then waiters of a lower priority class than this process's hold stay out
for that long, or until this process acquires again.
)doc");

REGISTER_OP("CrossoverLeaseStats")
    .Output("stats: float64")
    .Output("names: string")
    .Attr("group: string")
    .Attr("device_key: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      constexpr int64_t n = sizeof(kLeaseStatsFields) / sizeof(kLeaseStatsFields[0]);
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Vector(n));
      return absl::OkStatus();
    })
    .Doc(R"doc(
This process's lease statistics and, in the same order, their names (acquires, handoffs,
contended, recoveries, wait_s, hold_s, max_wait_s, max_hold_s, held).
)doc");

REGISTER_OP("CrossoverLeaseTimeline")
    .Output("events: int64")
    .Attr("group: string")
    .Attr("device_key: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Matrix(c->UnknownDim(), 4));
      return absl::OkStatus();
    })
    .Doc(R"doc(
This process's recent lease events, oldest first: [request_ns, acquired_ns, released_ns, tag]
in CLOCK_REALTIME nanoseconds (released_ns = 0 while held).
)doc");

REGISTER_KERNEL_BUILDER(Name("CrossoverAcquireLease").Device(DEVICE_CPU), AcquireLeaseOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverYieldLease").Device(DEVICE_CPU), YieldLeaseOp<false>);
REGISTER_KERNEL_BUILDER(Name("CrossoverLeaseStats").Device(DEVICE_CPU), LeaseStatsOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverLeaseTimeline").Device(DEVICE_CPU), LeaseTimelineOp);

// GPU: the pass-through tensors stay in device memory (forwarded, never copied); only the
// lease bookkeeping runs on the host. Stats and timeline are host-only and are placed on CPU.
REGISTER_KERNEL_BUILDER(Name("CrossoverAcquireLease").Device(DEVICE_GPU), AcquireLeaseOp);
REGISTER_KERNEL_BUILDER(Name("CrossoverYieldLease").Device(DEVICE_GPU), YieldLeaseOp<true>);

}  // namespace crossover
