// RMSNorm over the last dimension: out = w ⊙ x / sqrt(mean(x²) + eps), statistics in fp32.
//
// x may be [N, n] or [N, H, n] (per-head norm, e.g. Qwen3's q_norm/k_norm applied to every head
// with one weight vector). out may alias x.
#pragma once

#include "runtime/tensor.h"

namespace hydra::ops {

struct RmsNormParams {
  float eps = 1e-6f;
};

// out, x: [N, n] or [N, H, n]; weight [n].
void rms_norm(const TensorView& out, const TensorView& x, const TensorView& weight, const RmsNormParams& params);

#if HYDRA_CUDA
namespace cuda_impl {  // rmsnorm.cu; called by the dispatcher for CUDA views
void rms_norm(const TensorView& out, const TensorView& x, const TensorView& weight, const RmsNormParams& params);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
