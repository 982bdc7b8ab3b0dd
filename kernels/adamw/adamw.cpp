// The AdamW ops' entry points: shape checks, then the CUDA kernels (tensors on the GPU, adamw.cu)
// or the CPU reference (host tensors, adamw_reference.cpp).
#include "kernels/adamw/adamw.h"

#include <cmath>

#include "kernels/adamw/adamw_reference.h"
#include "kernels/common.h"

namespace hydra::ops {
namespace {

void expect_flat(const TensorView& v, const char* what, int64_t n) {
  expect_shape(v, what, {{"N", n}});
  HYDRA_ASSERT(v.is_contiguous(), "adamw {} must be contiguous", what);
}

}  // namespace

void adamw_update(const TensorView& master, const TensorView& m, const TensorView& v, const TensorView& grad,
                  const TensorView& weight, const AdamWParams& params) {
  HYDRA_ASSERT(master.rank() == 1, "adamw master must be flat [N], got {}", master.shape_string());
  const int64_t n = master.size(0);
  expect_flat(master, "master", n);
  expect_flat(m, "m", n);
  expect_flat(v, "v", n);
  expect_flat(grad, "grad", n);
  if (weight.defined()) expect_flat(weight, "weight", n);
  HYDRA_ASSERT(params.step >= 1, "adamw step {} (1-based)", params.step);
  if (shapes_only({master, m, v, grad, weight})) return;
  if (on_cuda({master, m, v, grad, weight})) {
#if HYDRA_CUDA
    cuda_impl::adamw_update(master, m, v, grad, weight, params);
    return;
#endif
  }
  reference::adamw_update(master, m, v, grad, weight, params);
}

void adamw_update(std::span<const AdamWSlice> slices, const AdamWParams& params) {
  if (slices.empty()) return;
  HYDRA_ASSERT(params.step >= 1, "adamw step {} (1-based)", params.step);
  for (const AdamWSlice& s : slices) {
    const int64_t n = s.master.numel();
    expect_flat(s.master, "master", n);
    expect_flat(s.m, "m", n);
    expect_flat(s.v, "v", n);
    expect_flat(s.grad, "grad", n);
    if (s.weight.defined()) expect_flat(s.weight, "weight", n);
  }
  if (shapes_only({slices[0].master})) return;
  if (on_cuda({slices[0].master})) {
#if HYDRA_CUDA
    cuda_impl::adamw_update(slices, params);
    return;
#endif
  }
  for (const AdamWSlice& s : slices) {
    AdamWParams p = params;
    if (!s.decay) p.weight_decay = 0.0f;
    adamw_update(s.master, s.m, s.v, s.grad, s.weight, p);
  }
}

void zero_tensors(std::span<const TensorView> xs) {
  if (xs.empty()) return;
  if (shapes_only({xs[0]})) return;
  if (on_cuda({xs[0]})) {
#if HYDRA_CUDA
    cuda_impl::zero_tensors(xs);
    return;
#endif
  }
  for (const TensorView& x : xs) fill(x, 0.0);
}

double sum_of_squares(std::span<const TensorView> xs) {
  if (!xs.empty() && shapes_only({xs[0]})) return 0.0;
  if (!xs.empty() && on_cuda({xs[0]})) {
#if HYDRA_CUDA
    for (const TensorView& x : xs) {
      HYDRA_ASSERT(x.is_contiguous() && on_cuda({x}), "sum_of_squares: a list of contiguous CUDA tensors, got {}",
                   x.shape_string());
    }
    return cuda_impl::sum_of_squares(xs);
#endif
  }
  double total = 0;
  for (const TensorView& x : xs) total += sum_of_squares(x);
  return total;
}

double sum_of_squares(const TensorView& x) {
  HYDRA_ASSERT(x.is_contiguous(), "sum_of_squares needs a contiguous tensor, got {}", x.shape_string());
  if (shapes_only({x})) return 0.0;
  if (on_cuda({x})) {
#if HYDRA_CUDA
    return cuda_impl::sum_of_squares(x);
#endif
  }
  return reference::sum_of_squares(x);
}

float adamw_bias_correction(float beta, int64_t step) {
  return static_cast<float>(1.0 - std::pow(double(beta), double(step)));
}

float adamw_decay_factor(float lr, float weight_decay) { return 1.0f - lr * weight_decay; }

DeviceUpdate::DeviceUpdate(std::span<const AdamWSlice> slices, std::span<const TensorView> norm_of,
                           std::span<const TensorView> zero, const AdamWParams& fixed, double grad_clip, Device device)
    : slices_(slices.begin(), slices.end()), norm_of_(norm_of.begin(), norm_of.end()), zero_(zero.begin(), zero.end()),
      fixed_(fixed), grad_clip_(grad_clip), device_(device),
      schedule_(Tensor::zeros({5}, DType::f64, device, "optimizer step scalars")) {
  for (const AdamWSlice& s : slices_) {
    HYDRA_ASSERT(s.master.defined() && s.master.device() == device, "a device update over blocks on another device");
  }
  if (device == Device::cuda) {
#if HYDRA_CUDA
    tables_ = cuda_impl::make_device_update(slices_, norm_of_, zero_);
#else
    HYDRA_ASSERT(false, "a device update on the GPU in a build without CUDA");
#endif
  }
}

DeviceUpdate::~DeviceUpdate() {
#if HYDRA_CUDA
  if (tables_ != nullptr) cuda_impl::free_device_update(static_cast<cuda_impl::DeviceUpdateTables*>(tables_));
#endif
}

void DeviceUpdate::write_schedule(float lr, int64_t step) {
  HYDRA_ASSERT(step >= 1, "adamw step {} (1-based)", step);
  // The eager update's own scalars (the helpers adamw.cu forms them with).
  Tensor host = Tensor::zeros({5}, DType::f64, Device::host);
  double* s = host.data_as<double>();
  s[0] = lr;
  s[1] = static_cast<double>(step);
  s[2] = adamw_bias_correction(fixed_.beta1, step);
  s[3] = adamw_bias_correction(fixed_.beta2, step);
  s[4] = adamw_decay_factor(lr, fixed_.weight_decay);
  copy_into(schedule_, host);  // on the GPU an upload queued in stream order (no wait)
}

void DeviceUpdate::launch(const TensorView& loss_sums, const TensorView& result) const {
  HYDRA_ASSERT(loss_sums.dtype() == DType::f64 && loss_sums.rank() == 2 && loss_sums.size(1) == 2 &&
                   loss_sums.is_contiguous(), "device update: loss sums must be contiguous [G, 2] f64, got {}",
               loss_sums.shape_string());
  HYDRA_ASSERT(result.dtype() == DType::f64 && result.numel() == kResultSlots && result.is_contiguous(),
               "device update: the result must be [3] f64, got {}", result.shape_string());
  HYDRA_ASSERT(loss_sums.device() == device_ && result.device() == device_, "device update: buffers on another device");
  if (device_ == Device::cuda) {
#if HYDRA_CUDA
    cuda_impl::launch_device_update(*static_cast<const cuda_impl::DeviceUpdateTables*>(tables_), fixed_, grad_clip_,
                                    schedule_.view(), loss_sums, result);
    return;
#endif
  }
  // The CPU: the eager tail's steps in its order, on host tensors.
  const double* sched = schedule_.data_as<const double>();
  const double* sums = loss_sums.data_as<const double>();
  double* out = result.data_as<double>();
  double loss = 0;
  for (int64_t g = 0; g < loss_sums.size(0); ++g) loss += sums[2 * g];
  const double norm = std::sqrt(sum_of_squares(norm_of_));
  out[kNorm] = norm;
  out[kClip] = 1.0;
  if (out[kSkipped] != 0 || !std::isfinite(loss) || !std::isfinite(norm)) {
    out[kSkipped] = 1;
    return;
  }
  if (grad_clip_ > 0 && norm > grad_clip_) out[kClip] = static_cast<float>(grad_clip_ / norm);
  AdamWParams p = fixed_;
  p.lr = static_cast<float>(sched[0]);
  p.step = static_cast<int64_t>(sched[1]);
  p.grad_scale = static_cast<float>(out[kClip]);
  adamw_update(slices_, p);
  zero_tensors(zero_);
}

}  // namespace hydra::ops
