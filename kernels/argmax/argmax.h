// Greedy decoding's choice on the device: the arg-max of each row of logits, so a greedy decode step
// copies B token ids to the host instead of B·V logits (19 MB at batch 32 and V = 151936).
// Ties go to the lowest index (as std::max_element); a row holding NaN or ±Inf gives −1, which the
// caller reports (model/generate.cpp). CPU reference and CUDA kernel (argmax.cu: a cluster of 8 CTAs per row).
#pragma once

#include "runtime/tensor.h"

namespace hydra::ops {

// ids [B] int32 (on the logits' device) ← arg-max of each row of logits [B, V] (fp32).
void row_argmax(const TensorView& ids, const TensorView& logits);

#if HYDRA_CUDA
namespace cuda_impl {
void row_argmax(const TensorView& ids, const TensorView& logits);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
