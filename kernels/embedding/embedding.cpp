#include "kernels/embedding/embedding.h"

#include <cstring>

#include "kernels/common.h"

namespace hydra::ops {

void embedding(const TensorView& out, const TensorView& table, const TensorView& ids) {
  expect_shape(table, "embedding table", {{"V", -1}, {"D", -1}});
  expect_shape(ids, "token ids", {{"T", -1}});
  expect_shape(out, "embedding out", {{"T", ids.size(0)}, {"D", table.size(1)}});
  expect_dtype(ids, "token ids", DType::i32);
  if (on_cuda({out, table, ids})) {
#if HYDRA_CUDA
    cuda_impl::embedding(out, table, ids);
    return;
#endif
  }
  expect_host_f32(out, "embedding out");
  expect_host_f32(table, "embedding table");
  const int64_t vocab = table.size(0), dim = table.size(1);
  const int32_t* id = ids.data_as<const int32_t>();
  for (int64_t t = 0; t < ids.size(0); ++t) {
    HYDRA_ASSERT(id[t] >= 0 && id[t] < vocab, "token id {} at {} outside [0, {})", id[t], t, vocab);
    std::memcpy(static_cast<float*>(out.element_ptr({t})), table.element_ptr({id[t]}), dim * sizeof(float));
  }
}

}  // namespace hydra::ops
