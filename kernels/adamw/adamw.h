// AdamW with decoupled weight decay on fp32 master weights (DESIGN.md §1.5), and the sum of squares the
// global gradient-norm clip needs. Both work on flat fp32 buffers so one launch covers a tensor.
#pragma once

#include <cstdint>
#include <span>

#include "runtime/tensor.h"

namespace hydra::ops {

struct AdamWParams {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled: master ← master − lr·wd·master, before the Adam step
  int64_t step = 1;           // 1-based, for the bias corrections 1 − β^step
  float grad_scale = 1.0f;    // multiplies the gradient first (the global-norm clip factor)
};

// One step on a block of N parameters: g = grad_scale·grad; m ← β1 m + (1−β1) g; v ← β2 v + (1−β2) g²;
// master ← master (1 − lr·wd) − lr m̂ / (sqrt(v̂) + eps) with m̂ = m/(1−β1^step), v̂ = v/(1−β2^step);
// then weight ← master (rounded to weight's dtype). master, m, v, grad: [N] fp32 contiguous;
// weight [N] fp32 or bf16, may alias master, or undefined (no model copy).
void adamw_update(const TensorView& master, const TensorView& m, const TensorView& v, const TensorView& grad,
                  const TensorView& weight, const AdamWParams& params);

// The same step on a list of blocks in one launch on the GPU (the optimizer's ~35–450 segments): each
// block with its own buffers and weight decay (`decay`: params.weight_decay applies, else none),
// bit-identical to calling adamw_update on each. On the CPU, adamw_update on each in turn.
struct AdamWSlice {
  TensorView master, m, v, grad, weight;
  bool decay = true;
};
void adamw_update(std::span<const AdamWSlice> slices, const AdamWParams& params);

// Zeroes every tensor of the list (contiguous fp32; on the GPU one launch for all of them).
void zero_tensors(std::span<const TensorView> xs);

// Σ x² of an fp32 tensor, accumulated in fp64 in a fixed order (the same result every run).
double sum_of_squares(const TensorView& x);
// Σ over the tensors of each one's sum_of_squares, added in the order given (the same value as
// adding the single-tensor results in a loop); on the GPU one synchronisation for all of them.
double sum_of_squares(std::span<const TensorView> xs);

#if HYDRA_CUDA
namespace cuda_impl {  // adamw.cu
void adamw_update(const TensorView& master, const TensorView& m, const TensorView& v, const TensorView& grad,
                  const TensorView& weight, const AdamWParams& params);
double sum_of_squares(const TensorView& x);
double sum_of_squares(std::span<const TensorView> xs);
void adamw_update(std::span<const AdamWSlice> slices, const AdamWParams& params);
void zero_tensors(std::span<const TensorView> xs);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
