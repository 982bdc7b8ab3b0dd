// The CPU reference of the delta-rule step (delta_rule_step_reference.cpp), called by its entry point
// (delta_rule_step.cpp) for host tensors once shapes are checked: the op's arguments, with the query
// scale resolved. Internal to kernels/delta_rule/.
#pragma once

#include "kernels/delta_rule/delta_rule_step.h"

namespace hydra::ops::reference {

void delta_rule_step(const TensorView& out, const TensorView& state, const TensorView& slots, const TensorView& q,
                     const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
                     double scale);

}  // namespace hydra::ops::reference
