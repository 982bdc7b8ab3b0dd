// add_row_sums: shape checks, then the CUDA kernel (row_sum.cu) or the host sum in row order.
#include "kernels/row_sum/row_sum.h"

#include "kernels/common.h"

namespace hydra::ops {

void add_row_sums(const TensorView& sums, const TensorView& values, const TensorView& marks) {
  expect_shape(sums, "row sums", {{"2", 2}});
  expect_shape(values, "row values", {{"n", -1}});
  expect_dtype(sums, "row sums", DType::f64);
  if (marks.defined()) {
    expect_shape(marks, "row marks", {{"n", values.size(0)}});
    expect_dtype(marks, "row marks", DType::i32);
  }
  if (shapes_only({sums, values, marks})) return;
  if (on_cuda({sums, values, marks})) {
#if HYDRA_CUDA
    cuda_impl::add_row_sums(sums, values, marks);
    return;
#endif
  }
  HYDRA_ASSERT(values.dtype() == DType::f32 || values.dtype() == DType::f64, "row values must be f32 or f64 (are {})",
               dtype_name(values.dtype()));
  double* s = sums.data_as<double>();
  for (int64_t i = 0; i < values.size(0); ++i) {  // one after the other: the order of the former host sum
    const double v = values.dtype() == DType::f32 ? static_cast<double>(*at<const float>(values, {i}))
                                                  : *at<const double>(values, {i});
    s[0] += v;
    if (marks.defined() && *at<const int32_t>(marks, {i}) != 0) s[1] += v;
  }
}

}  // namespace hydra::ops
