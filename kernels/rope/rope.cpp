// RoPE's entry point: shape checks, then the CUDA kernel (tensors on the GPU, rope.cu) or the CPU
// reference (host tensors, rope_reference.cpp).
#include "kernels/rope/rope.h"

#include "kernels/common.h"
#include "kernels/rope/rope_reference.h"

namespace hydra::ops {

void rope(const TensorView& x, const TensorView& positions, const RopeParams& params) {
  expect_shape(x, "rope x", {{"T", -1}, {"H", -1}, {"d", -1}});
  expect_shape(positions, "rope positions", {{"T", x.size(0)}});
  expect_dtype(positions, "rope positions", DType::i64);
  if (shapes_only({x, positions})) return;
  if (on_cuda({x, positions})) {
#if HYDRA_CUDA
    cuda_impl::rope(x, positions, params);
    return;
#endif
  }
  reference::rope(x, positions, params);
}

}  // namespace hydra::ops
