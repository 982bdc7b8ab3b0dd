// The CPU reference of the attention ops (attention_reference.cpp), called by their entry points
// (attention.cpp) for host tensors once shapes are checked: same arguments and results as the ops
// of attention.h. Internal to kernels/attention/.
#pragma once

#include "kernels/attention/attention.h"

namespace hydra::ops::reference {

void attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                       const TensorView& v, const AttentionParams& p);
void attention_merge(const TensorView& out, const TensorView& lse, const TensorView& part_out, const TensorView& part_lse);
void attention_backward_prepare(const TensorView& delta, const TensorView& d_out, const TensorView& out);
void attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& d_out,
                        const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& lse,
                        const TensorView& delta, const AttentionParams& params);

}  // namespace hydra::ops::reference
