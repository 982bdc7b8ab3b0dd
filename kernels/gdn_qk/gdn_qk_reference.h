// The CPU reference of the GDN input-pass ops (gdn_qk_reference.cpp), called by their entry points
// (gdn_qk.cpp) for host tensors once shapes are checked: same arguments and results as the ops of
// gdn_qk.h. Internal to kernels/gdn_qk/.
#pragma once

#include "kernels/gdn_qk/gdn_qk.h"

namespace hydra::ops::reference {

void gdn_qkv_conv(const TensorView& out, const TensorView& inv_norm, const TensorView& x, const TensorView& w,
                  const TensorView& prefix, const TensorView& positions, const GdnQkParams& params);
void gdn_qk_backward(const TensorView& dx, const TensorView& dy, const TensorView& y, const TensorView& inv_norm,
                     const TensorView& positions, const GdnQkParams& params);

}  // namespace hydra::ops::reference
