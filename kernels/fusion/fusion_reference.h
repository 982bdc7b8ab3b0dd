// The CPU reference of the head-fusion ops (fusion_reference.cpp), called by their entry points
// (fusion.cpp) for host tensors once shapes are checked: same arguments and results as the ops of
// fusion.h. Internal to kernels/fusion/.
#pragma once

#include "kernels/fusion/fusion.h"

namespace hydra::ops::reference {

void head_fusion(const TensorView& y, const TensorView& o, const FusionTensors& p, const HeadFusionParams& params);
void head_fusion_backward(const TensorView& d_o, const FusionTensors& grads, const TensorView& d_y,
                          const TensorView& o, const FusionTensors& p, const HeadFusionParams& params);

}  // namespace hydra::ops::reference
