// The CPU reference of the AdamW ops (adamw_reference.cpp), called by their entry points (adamw.cpp)
// for host tensors once shapes are checked: same arguments and results as the ops of adamw.h.
// Internal to kernels/adamw/.
#pragma once

#include "kernels/adamw/adamw.h"

namespace hydra::ops::reference {

void adamw_update(const TensorView& master, const TensorView& m, const TensorView& v, const TensorView& grad,
                  const TensorView& weight, const AdamWParams& params);
double sum_of_squares(const TensorView& x);

}  // namespace hydra::ops::reference
