// The AdamW ops' entry points: shape checks, then the CUDA kernels (tensors on the GPU, adamw.cu)
// or the CPU reference (host tensors, adamw_reference.cpp).
#include "kernels/adamw/adamw.h"

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

}  // namespace hydra::ops
