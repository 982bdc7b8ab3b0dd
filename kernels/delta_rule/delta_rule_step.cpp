// The single-token delta-rule step's entry point (delta_rule_step.h): shape checks, then the CUDA
// kernel (tensors on the GPU, delta_rule_step.cu) or the CPU reference (host tensors,
// delta_rule_step_reference.cpp).
#include "kernels/delta_rule/delta_rule_step.h"

#include <cmath>

#include "kernels/common.h"
#include "kernels/delta_rule/delta_rule_step_reference.h"

namespace hydra::ops {

void delta_rule_step(const TensorView& out, const TensorView& state, const TensorView& slots, const TensorView& q,
                     const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
                     const DeltaRuleParams& params) {
  expect_shape(k, "delta step k", {{"B", -1}, {"H", -1}, {"dk", -1}});
  const int64_t rows = k.size(0), heads = k.size(1), dk = k.size(2);
  expect_shape(q, "delta step q", {{"B", rows}, {"H", heads}, {"dk", dk}});
  expect_shape(v, "delta step v", {{"B", rows}, {"H", heads}, {"dv", -1}});
  const int64_t dv = v.size(2);
  expect_shape(out, "delta step out", {{"B", rows}, {"H", heads}, {"dv", dv}});
  expect_shape(g, "delta step g", {{"B", rows}, {"H", heads}});
  expect_shape(beta, "delta step beta", {{"B", rows}, {"H", heads}});
  expect_shape(state, "delta step state", {{"S", -1}, {"H", heads}, {"dk", dk}, {"dv", dv}});
  if (slots.defined()) {
    expect_shape(slots, "delta step slots", {{"B", rows}});
    expect_dtype(slots, "delta step slots", DType::i32);
  } else {
    HYDRA_ASSERT(state.size(0) >= rows, "delta step: {} rows without a slot map need as many slots (have {})", rows,
                 state.size(0));
  }
  const double scale = params.scale > 0 ? params.scale : 1.0 / std::sqrt(static_cast<double>(dk));
  if (shapes_only({out, state, slots, q, k, v, g, beta})) return;
  if (on_cuda({out, state, slots, q, k, v, g, beta})) {
#if HYDRA_CUDA
    cuda_impl::delta_rule_step(out, state, slots, q, k, v, g, beta, static_cast<float>(scale));
    return;
#endif
  }
  reference::delta_rule_step(out, state, slots, q, k, v, g, beta, scale);
}

}  // namespace hydra::ops
