// The GDN branch of a decode step (model/model_forward.cpp, gdn_branch) as one op: for each row b
// (cache slot slots[b]) and GDN head h of a layer with H GDN heads of dimension d,
//   q, k, v = gdn_qkv_conv_step(x[b]) (conv over the cached tail, which advances; RoPE and L2 norm
//             of q and k; gdn_qk_step.h),
//   β, g    = gdn_gates(b_logits[b], a_logits[b]) (gdn_gates.h),
//   out     = delta_rule_step(q, k, v, g, β) on the slot's state (delta_rule_step.h),
// the conv output [q | k | v] (q and k of head h in columns h·d and (H + h)·d, v in (2H + h)·d),
// the inverse norms, β and g written as the three ops write them.
//
// The CPU runs the three ops' references in that order (the reference of both GPU forms). On the
// GPU, params.decode_kernel chooses (kernels/kernel_options.h, gdn_decode): separate runs the three
// CUDA ops (three launches); fused (gdn_decode.cu) runs them as one launch, with the arithmetic of
// the three (q, k and v rounded to bf16 between the conv and the step, as the conv output holds
// them), the state's two column sums in another order. CUDA: as the three ops take them, d ∈ {64,
// 128}, conv taps ≤ 8.
#pragma once

#include "kernels/delta_rule/delta_rule.h"
#include "kernels/gdn_qk/gdn_qk.h"
#include "runtime/tensor.h"

namespace hydra::ops {

struct GdnDecodeTensors {
  // Written: out [B, H, d]; conv_out [B, 3·H·d] (must not alias x); inv_norm [B, 2H]; beta, g [B, H].
  TensorView out{}, conv_out{}, inv_norm{}, beta{}, g{};
  // The caches (read and advanced): state [S, H, d, d]; tail [S, K−1, 3·H·d] (undefined when K = 1).
  TensorView state{}, tail{};
  // slots [B] int32 (distinct; undefined: row b uses slot b); positions [B] int64 (RoPE).
  TensorView slots{}, positions{};
  // x [B, 3·H·d] (the pre-conv q/k/v columns); conv_w [3·H·d, K]; b_logits, a_logits [B, H];
  // a_log, dt_bias [H].
  TensorView x{}, conv_w{}, b_logits{}, a_logits{}, a_log{}, dt_bias{};
};

// qk.qk_heads must be 2H and qk.head_dim d; rule.scale as in delta_rule.h.
void gdn_decode_step(const GdnDecodeTensors& t, const GdnQkParams& qk, const DeltaRuleParams& rule);

#if HYDRA_CUDA
namespace cuda_impl {  // gdn_decode.cu
void gdn_decode_fused(const GdnDecodeTensors& t, const GdnQkParams& qk, float scale);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
