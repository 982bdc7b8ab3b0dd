// RMSNorm over the last dimension: out = w ⊙ x / sqrt(mean(x²) + eps), statistics in fp32.
//
// x may be [N, n] or [N, H, n] (per-head norm, e.g. Qwen3's q_norm/k_norm applied to every head
// with one weight vector). out may alias x.
#pragma once

#include "kernels/accumulate.h"
#include "runtime/tensor.h"

namespace hydra::ops {

struct RmsNormParams {
  float eps = 1e-6f;
};

// out, x: [N, n] or [N, H, n]; weight [n].
void rms_norm(const TensorView& out, const TensorView& x, const TensorView& weight, const RmsNormParams& params);

// Backward: with r = 1/sqrt(mean(x²) + eps) and y = w ⊙ x r,
//   dx = r (w ⊙ dy) − x r³ mean(x ⊙ w ⊙ dy),   dw += Σ_rows dy ⊙ x r.
// dx, dy, x: [N, n] or [N, H, n] (dx may alias dy); `accumulate` adds dx to what dx holds (the
// residual stream's gradient). d_weight [n] (fp32) sums over every row (and head); undefined: not
// needed. GPU: x, dy bf16 or fp32; dx bf16 or fp32.
void rms_norm_backward(const TensorView& dx, const TensorView& d_weight, const TensorView& dy, const TensorView& x,
                       const TensorView& weight, const RmsNormParams& params, Accumulate accumulate = Accumulate::no);

#if HYDRA_CUDA
namespace cuda_impl {  // rmsnorm.cu; called by the dispatcher for CUDA views
void rms_norm(const TensorView& out, const TensorView& x, const TensorView& weight, const RmsNormParams& params);
void rms_norm_backward(const TensorView& dx, const TensorView& d_weight, const TensorView& dy, const TensorView& x,
                       const TensorView& weight, const RmsNormParams& params, Accumulate accumulate);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
