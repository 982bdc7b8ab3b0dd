// Token embedding lookup: out[t] = table[ids[t]].
#pragma once

#include "runtime/tensor.h"

namespace hydra::ops {

// out [T, D], table [V, D], ids [T] int32 (every id in [0, V); callers validate user input first).
void embedding(const TensorView& out, const TensorView& table, const TensorView& ids);

#if HYDRA_CUDA
namespace cuda_impl {  // embedding.cu; called by the dispatcher for CUDA views
void embedding(const TensorView& out, const TensorView& table, const TensorView& ids);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
