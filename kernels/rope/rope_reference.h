// The CPU reference of RoPE (rope_reference.cpp), called by its entry point (rope.cpp) for host tensors
// once shapes are checked: same arguments and results as rope of rope.h. Internal to kernels/rope/.
#pragma once

#include "kernels/rope/rope.h"

namespace hydra::ops::reference {

void rope(const TensorView& x, const TensorView& positions, const RopeParams& params);

}  // namespace hydra::ops::reference
