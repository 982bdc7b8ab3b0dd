#include "kernels/argmax/argmax.h"

#include <cmath>

#include "kernels/common.h"

namespace hydra::ops {

void row_argmax(const TensorView& ids, const TensorView& logits) {
  expect_shape(logits, "argmax logits", {{"B", -1}, {"V", -1}});
  expect_shape(ids, "argmax ids", {{"B", logits.size(0)}});
  expect_dtype(ids, "argmax ids", DType::i32);
  expect_dtype(logits, "argmax logits", DType::f32);
  if (shapes_only({ids, logits})) return;
  if (on_cuda({ids, logits})) {
#if HYDRA_CUDA
    cuda_impl::row_argmax(ids, logits);
    return;
#endif
  }
  for (int64_t b = 0; b < logits.size(0); ++b) {
    const float* row = at<const float>(logits, {b});
    int64_t best = 0;
    bool finite = true;
    for (int64_t i = 0; i < logits.size(1); ++i) {
      finite = finite && std::isfinite(row[i]);
      if (row[i] > row[best]) best = i;
    }
    *at<int32_t>(ids, {b}) = finite ? static_cast<int32_t>(best) : -1;
  }
}

}  // namespace hydra::ops
