// The embedding ops' entry points: shape checks, then the CUDA kernels (tensors on the GPU,
// embedding.cu) or the CPU reference (host tensors, embedding_reference.cpp).
#include "kernels/embedding/embedding.h"

#include "kernels/common.h"
#include "kernels/embedding/embedding_reference.h"

namespace hydra::ops {

void embedding(const TensorView& out, const TensorView& table, const TensorView& ids) {
  expect_shape(table, "embedding table", {{"V", -1}, {"D", -1}});
  expect_shape(ids, "token ids", {{"T", -1}});
  expect_shape(out, "embedding out", {{"T", ids.size(0)}, {"D", table.size(1)}});
  expect_dtype(ids, "token ids", DType::i32);
  if (shapes_only({out, table, ids})) return;
  if (on_cuda({out, table, ids})) {
#if HYDRA_CUDA
    cuda_impl::embedding(out, table, ids);
    return;
#endif
  }
  reference::embedding(out, table, ids);
}

void embedding_backward(const TensorView& d_table, const TensorView& d_out, const TensorView& ids) {
  expect_shape(d_table, "embedding d_table", {{"V", -1}, {"D", -1}});
  expect_shape(ids, "token ids", {{"T", -1}});
  expect_shape(d_out, "embedding d_out", {{"T", ids.size(0)}, {"D", d_table.size(1)}});
  expect_dtype(ids, "token ids", DType::i32);
  if (shapes_only({d_table, d_out, ids})) return;
  if (on_cuda({d_table, d_out, ids})) {
#if HYDRA_CUDA
    cuda_impl::embedding_backward(d_table, d_out, ids);
    return;
#endif
  }
  reference::embedding_backward(d_table, d_out, ids);
}

}  // namespace hydra::ops
