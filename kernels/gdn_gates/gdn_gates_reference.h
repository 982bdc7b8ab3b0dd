// The CPU reference of the GDN gate ops (gdn_gates_reference.cpp), called by their entry points
// (gdn_gates.cpp) for host tensors once shapes are checked: same arguments and results as the ops of
// gdn_gates.h. Internal to kernels/gdn_gates/.
#pragma once

#include "kernels/gdn_gates/gdn_gates.h"

namespace hydra::ops::reference {

void gdn_gates(const TensorView& beta, const TensorView& g, const TensorView& b_logits, const TensorView& a_logits,
               const TensorView& a_log, const TensorView& dt_bias);
void gdn_gates_backward(const TensorView& d_b_logits, const TensorView& d_a_logits, const TensorView& d_a_log,
                        const TensorView& d_dt_bias, const TensorView& d_beta, const TensorView& d_g,
                        const TensorView& b_logits, const TensorView& a_logits, const TensorView& a_log,
                        const TensorView& dt_bias);

}  // namespace hydra::ops::reference
