// The CPU reference of the delta rule's ops, called by their entry points (delta_rule.cpp,
// delta_rule_backward.cpp) for host tensors once shapes are checked: same arguments and results as the
// ops of delta_rule.h (the forward in delta_rule_reference.cpp, the backward in
// delta_rule_backward_reference.cpp). Internal to kernels/delta_rule/.
#pragma once

#include "kernels/delta_rule/delta_rule.h"

namespace hydra::ops::reference {

void delta_rule_recurrent(const TensorView& out, const TensorView& state, const TensorView& q, const TensorView& k,
                          const TensorView& v, const TensorView& g, const TensorView& beta,
                          const DeltaRuleParams& params);
void delta_rule_chunked(const TensorView& out, const TensorView& state, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& g, const TensorView& beta,
                        const DeltaRuleParams& params);
void delta_rule_segment_map(const TensorView& m, const TensorView& s_ext, const TensorView& k, const TensorView& v,
                            const TensorView& g, const TensorView& beta, const DeltaRuleParams& params);
void delta_rule_apply_map(const TensorView& state, const TensorView& m, const TensorView& s_ext);

// The backward (delta_rule_backward_reference.cpp).
void delta_rule_chunked_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                 const TensorView& dg, const TensorView& dbeta, const TensorView& d_state,
                                 const TensorView& d_out, const TensorView& q, const TensorView& k,
                                 const TensorView& v, const TensorView& g, const TensorView& beta,
                                 const TensorView& state0, const DeltaRuleParams& params);
void delta_rule_state_backward(const TensorView& d_state, const TensorView& d_out, const TensorView& q,
                               const TensorView& k, const TensorView& g, const TensorView& beta,
                               const DeltaRuleParams& params);
void delta_rule_apply_map_transposed(const TensorView& d_state, const TensorView& m, const TensorView& d_loc);

}  // namespace hydra::ops::reference
