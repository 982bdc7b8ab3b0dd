// What a layer's forward (model_forward.cpp) and its backward (model_backward.cpp) both need, written
// once: the head columns of the fused projection and the dispatch of the FA and GDN branches.
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/fusion/fusion.h"
#include "model/model.h"
#include "runtime/concurrency.h"
#include "runtime/tensor.h"

namespace hydra {

// A view of columns [begin, begin + heads·d) of a [T, N] matrix as [T, heads, d].
inline TensorView head_columns(const TensorView& m, int64_t begin, int64_t heads, int64_t d) {
  return m.narrow(1, begin, heads * d).split_dim(1, heads, d);
}

// A HydraHead layer's fusion tensors (those of its variant; the others undefined): the gate's logits
// are columns of the fused projection's output `proj` [T, rows].
inline ops::FusionTensors fusion_tensors(const LayerWeights& w, const TensorView& proj, const ProjectionColumns& col) {
  return {.weight = w.fuse_norm.view(),
          .gamma = w.fuse_gamma.view(),
          .gate = col.fuse_gate >= 0 ? proj.narrow(1, col.fuse_gate, static_cast<int64_t>(w.head_of.size())) : TensorView(),
          .gate_bias = w.fuse_gate_bias.view()};
}

// A layer's FA branch (fa_heads > 0) and GDN branch (gdn_heads > 0). They are independent (DESIGN.md
// §3.5): with both, on the GPU the GDN branch runs on a side stream while the FA ring's transfers and
// attention run on this one. Collectives of both branches go through the communicator's own stream
// in the host order (GDN first), the same on every rank, so the overlap cannot reorder them across
// ranks.
inline void run_branches(Device device, Branches branches, int64_t fa_heads, int64_t gdn_heads,
                         const std::function<void()>& fa, const std::function<void()>& gdn) {
  if (fa_heads > 0 && gdn_heads > 0) {
    run_concurrently(device, branches, fa, gdn);
  } else if (fa_heads > 0) {
    fa();
  } else if (gdn_heads > 0) {
    gdn();
  }
}

}  // namespace hydra
