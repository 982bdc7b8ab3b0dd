// One token of the gated delta rule (DESIGN.md §1.2) for each row of a decode step: the recurrent
// form of delta_rule.h applied once, to a state kept between calls (model/kv_cache.h), per head:
//   S ← e^{g} S;  δ = β (v − Sᵀk);  S ← S + k δᵀ;  o = Sᵀ (q · scale).
// Every value column j of S is independent (δ_j and o_j read column j only), which the CUDA kernel
// uses to split a head's state over CTAs by column tiles.
//
// Row b of the step updates the state of cache slot slots[b] (several sequences decode together,
// each in its own slot). CPU: float or double views, the step in fp64, the state stored back in its
// type. CUDA (delta_rule_step.cu): q, k, v, out bf16; g, β and the state fp32; dk = dv ∈ {64, 128}.
#pragma once

#include "kernels/delta_rule/delta_rule.h"
#include "runtime/tensor.h"

namespace hydra::ops {

// out [B, H, dv]; state [S, H, dk, dv] (in/out; rows of distinct slots); slots [B] int32 (values in
// [0, S), distinct), or undefined: row b uses slot b; q, k [B, H, dk]; v [B, H, dv]; g, beta [B, H].
// params.scale as in delta_rule.h (0: 1/sqrt(dk)); the chunk options are not used.
void delta_rule_step(const TensorView& out, const TensorView& state, const TensorView& slots, const TensorView& q,
                     const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
                     const DeltaRuleParams& params);

#if HYDRA_CUDA
namespace cuda_impl {  // delta_rule_step.cu
void delta_rule_step(const TensorView& out, const TensorView& state, const TensorView& slots, const TensorView& q,
                     const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta, float scale);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
