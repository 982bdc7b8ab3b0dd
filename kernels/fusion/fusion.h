// Fusion of the head outputs before W_o (DESIGN.md §1.2), one of five variants, the same for FA and
// GDN heads, statistics in fp32 (fp64 on the CPU):
//   scale_norm  y_h = γ_h · RMSNorm(o_h; w_h)                      (the default)
//   norm        y_h = RMSNorm(o_h; w_h)
//   scale       y_h = γ_h · o_h
//   concat      y_h = o_h                                          (the teacher's own form)
//   gate        y_h = 2σ(s_h + b_h) · γ_h · RMSNorm(o_h; w_h),     s_h = u_h · x̂ (the layer input after
//               its input norm), computed by the model as columns of the fused input projection.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/buffer_spec.h"
#include "runtime/tensor.h"

namespace hydra::ops {

enum class Fusion : uint8_t { scale_norm, norm, scale, concat, gate };
inline constexpr Fusion kFusions[] = {Fusion::scale_norm, Fusion::norm, Fusion::scale, Fusion::concat, Fusion::gate};

const char* fusion_name(Fusion fusion);
// The variant called `name`; a UserError naming it and the choices otherwise. `what` says where
// the name came from ("--fusion", "model.h5: config").
Fusion fusion_from_name(const std::string& name, const std::string& what);
// The tensors a variant has: w_fuse [H, d], γ [H], the gate's u [H, D] and b [H].
inline bool fusion_has_norm(Fusion f) { return f == Fusion::scale_norm || f == Fusion::norm || f == Fusion::gate; }
inline bool fusion_has_gamma(Fusion f) { return f == Fusion::scale_norm || f == Fusion::scale || f == Fusion::gate; }
inline bool fusion_has_gate(Fusion f) { return f == Fusion::gate; }

struct HeadFusionParams {
  float eps = 1e-6f;
  Fusion fusion = Fusion::scale_norm;
};

// The parameters of a variant (undefined where it has none), or their gradients.
struct FusionTensors {
  TensorView weight;     // [H, d]: w_fuse (scale_norm, norm, gate)
  TensorView gamma;      // [H]: γ (scale_norm, scale, gate)
  TensorView gate;       // [T, H]: s = u_h · x̂, the gate's logit before its bias (gate); may be strided
  TensorView gate_bias;  // [H]: b (gate)
};

// y, o: [T, H, d] (y may alias o).
void head_fusion(const TensorView& y, const TensorView& o, const FusionTensors& p, const HeadFusionParams& params);

// Backward, per (token, head), with n = RMSNorm(o_h; w_h) (o_h itself without a norm), g = 2σ(s + b)
// (1 without a gate) and c = γ_h g (γ_h = 1 without a γ):
//   d_o from rms_norm_backward of c d_y (c d_y itself without a norm), d_w[h] += Σ_t c d_y ⊙ o r,
//   d_γ[h] += Σ_t g d_y · n, d_s = γ_h (d_y · n) · 2σ(1 − σ), d_b[h] += Σ_t d_s.
// d_o [T, H, d] overwritten (may alias d_y); grads.gate [T, H] overwritten; grads.weight, .gamma and
// .gate_bias accumulate (+=). An undefined gradient is not computed (d_s and d_b are computed together).
void head_fusion_backward(const TensorView& d_o, const FusionTensors& grads, const TensorView& d_y,
                          const TensorView& o, const FusionTensors& p, const HeadFusionParams& params);

// The CUDA backward's row scalars of the variants other than scale_norm (fusion.cu), [3, T·H] fp32:
// what the memory plan prices (the model runs no fusion op for concat).
inline BufferSpec head_fusion_backward_scratch(int64_t tokens, int64_t heads, Fusion f) {
  if (f == Fusion::scale_norm) return {};
  return {{3, tokens * heads}, DType::f32};
}

#if HYDRA_CUDA
namespace cuda_impl {  // fusion.cu; called by the dispatcher for CUDA views
void head_fusion(const TensorView& y, const TensorView& o, const FusionTensors& p, const HeadFusionParams& params);
void head_fusion_backward(const TensorView& d_o, const FusionTensors& grads, const TensorView& d_y,
                          const TensorView& o, const FusionTensors& p, const HeadFusionParams& params);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
