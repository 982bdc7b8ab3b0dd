// Token embedding lookup: out[t] = table[ids[t]].
#pragma once

#include "runtime/tensor.h"

namespace hydra::ops {

// out [T, D], table [V, D], ids [T] int32 (every id in [0, V); callers validate user input first).
void embedding(const TensorView& out, const TensorView& table, const TensorView& ids);

// d_table [V, D] += the rows of d_out [T, D] scattered by ids [T] (a row repeated in ids sums its
// gradients). d_table is fp32 on both devices; on the GPU d_out may be bf16 or fp32.
void embedding_backward(const TensorView& d_table, const TensorView& d_out, const TensorView& ids);

#if HYDRA_CUDA
namespace cuda_impl {  // embedding.cu; called by the dispatcher for CUDA views
void embedding(const TensorView& out, const TensorView& table, const TensorView& ids);
void embedding_backward(const TensorView& d_table, const TensorView& d_out, const TensorView& ids);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
