// The training losses' entry points: shape checks, then the CUDA kernels (tensors on the GPU, loss.cu)
// or the CPU reference (host tensors, loss_reference.cpp).
#include "kernels/loss/loss.h"

#include "kernels/common.h"
#include "kernels/loss/loss_reference.h"

namespace hydra::ops {
namespace {

// A separate `grad` has the logits' shape (the CPU reference computes in place, then copies into it).
void expect_grad_shape(const TensorView& grad, const TensorView& logits) {
  if (grad.defined()) expect_shape(grad, "loss gradient", {{"n", logits.size(0)}, {"V", logits.size(1)}});
}

}  // namespace

void cross_entropy_with_grad(const TensorView& logits, const TensorView& row_loss, const TensorView& targets,
                             float grad_scale, const TensorView& grad, const TensorView& scale_at_run_time) {
  expect_shape(logits, "cross_entropy logits", {{"n", -1}, {"V", -1}});
  if (scale_at_run_time.defined()) {
    expect_shape(scale_at_run_time, "cross_entropy scale", {{"1", 1}});
    expect_dtype(scale_at_run_time, "cross_entropy scale", DType::f32);
  }
  expect_shape(targets, "cross_entropy targets", {{"n", logits.size(0)}});
  expect_shape(row_loss, "cross_entropy row_loss", {{"n", logits.size(0)}});
  expect_dtype(targets, "cross_entropy targets", DType::i32);
  HYDRA_ASSERT(logits.size(1) > 0, "cross_entropy over an empty vocabulary");
  expect_grad_shape(grad, logits);
  if (shapes_only({logits, row_loss, targets, grad, scale_at_run_time})) return;
  if (on_cuda({logits, row_loss, targets, grad, scale_at_run_time})) {
#if HYDRA_CUDA
    cuda_impl::cross_entropy_with_grad(logits, row_loss, targets, grad_scale, grad, scale_at_run_time);
    return;
#endif
  }
  // The host runs the op now: "run time" is this call.
  if (scale_at_run_time.defined()) grad_scale = *scale_at_run_time.data_as<const float>();
  reference::cross_entropy_with_grad(logits, row_loss, targets, grad_scale, grad);
}

void kl_divergence_with_grad(const TensorView& student_logits, const TensorView& row_loss,
                             const TensorView& teacher_logits, float grad_scale, const TensorView& grad,
                             const TensorView& targets) {
  expect_shape(student_logits, "kl student logits", {{"n", -1}, {"V", -1}});
  const int64_t rows = student_logits.size(0), vocab = student_logits.size(1);
  expect_shape(teacher_logits, "kl teacher logits", {{"n", rows}, {"V", vocab}});
  expect_shape(row_loss, "kl row_loss", {{"n", rows}});
  if (targets.defined()) {
    expect_shape(targets, "kl targets", {{"n", rows}});
    HYDRA_ASSERT(targets.dtype() == DType::i32, "kl targets must be int32");
  }
  HYDRA_ASSERT(vocab > 0, "kl divergence over an empty vocabulary");
  expect_grad_shape(grad, student_logits);
  if (shapes_only({student_logits, row_loss, teacher_logits, grad, targets})) return;
  if (on_cuda({student_logits, row_loss, teacher_logits, grad, targets})) {
#if HYDRA_CUDA
    cuda_impl::kl_divergence_with_grad(student_logits, row_loss, teacher_logits, grad_scale, grad, targets);
    return;
#endif
  }
  reference::kl_divergence_with_grad(student_logits, row_loss, teacher_logits, grad_scale, grad, targets);
}

void squared_error_with_grad(const TensorView& d_a, const TensorView& row_loss, const TensorView& a,
                             const TensorView& b, float grad_scale) {
  expect_shape(a, "squared_error a", {{"n", -1}, {"D", -1}});
  const int64_t rows = a.size(0), dim = a.size(1);
  expect_shape(b, "squared_error b", {{"n", rows}, {"D", dim}});
  expect_shape(d_a, "squared_error d_a", {{"n", rows}, {"D", dim}});
  expect_shape(row_loss, "squared_error row_loss", {{"n", rows}});
  if (shapes_only({d_a, row_loss, a, b})) return;
  if (on_cuda({d_a, row_loss, a, b})) {
#if HYDRA_CUDA
    cuda_impl::squared_error_with_grad(d_a, row_loss, a, b, grad_scale);
    return;
#endif
  }
  reference::squared_error_with_grad(d_a, row_loss, a, b, grad_scale);
}

}  // namespace hydra::ops
