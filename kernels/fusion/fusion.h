// Scale-normalised fusion of the head outputs (DESIGN.md §1.2): y_h = γ_h · RMSNorm(o_h; w_fuse[h]),
// the same for FA and GDN heads, statistics in fp32.
#pragma once

#include "runtime/tensor.h"

namespace hydra::ops {

struct HeadFusionParams {
  float eps = 1e-6f;
};

// y, o: [T, H, d] (y may alias o); weight [H, d]; gamma [H].
void head_fusion(const TensorView& y, const TensorView& o, const TensorView& weight, const TensorView& gamma,
                 const HeadFusionParams& params);

// Backward of y_h = γ_h · RMSNorm(o_h; w_h): with n = RMSNorm(o_h; w_h),
//   d_o from rms_norm_backward of (γ_h d_y), d_weight[h] += Σ_t γ_h d_y ⊙ o r, d_gamma[h] += Σ_t d_y · n.
// d_o [T, H, d] overwritten (may alias d_y); d_weight [H, d], d_gamma [H] fp32 accumulate.
void head_fusion_backward(const TensorView& d_o, const TensorView& d_weight, const TensorView& d_gamma,
                          const TensorView& d_y, const TensorView& o, const TensorView& weight,
                          const TensorView& gamma, const HeadFusionParams& params);

#if HYDRA_CUDA
namespace cuda_impl {  // fusion.cu; called by the dispatcher for CUDA views
void head_fusion(const TensorView& y, const TensorView& o, const TensorView& weight, const TensorView& gamma,
                 const HeadFusionParams& params);
void head_fusion_backward(const TensorView& d_o, const TensorView& d_weight, const TensorView& d_gamma,
                          const TensorView& d_y, const TensorView& o, const TensorView& weight,
                          const TensorView& gamma, const HeadFusionParams& params);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
