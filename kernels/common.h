// Helpers shared by the ops' CPU implementations and dispatchers.
//
// Every op is one function taking views; it checks shapes, then dispatches on the device of its
// output: host views run the fp32 CPU implementation in the op's folder (the reference the CUDA
// kernel is tested against), CUDA views run the launcher in the op's .cu file.
#pragma once

#include <cstdint>

#include "runtime/tensor.h"

namespace hydra::ops {

// Whether the op runs on the GPU (all defined views on CUDA) or the host (all on host).
inline bool on_cuda(std::initializer_list<TensorView> views) {
  expect_same_device(views);
  for (const TensorView& v : views) {
    if (v.defined()) return v.device() == Device::cuda;
  }
  return false;
}

// Host fp32 requirement for CPU implementations.
inline void expect_host_f32(const TensorView& v, const char* what) {
  HYDRA_ASSERT(v.on_host() && v.dtype() == DType::f32, "{} must be a host float32 tensor (is {} {})", what,
               device_name(v.device()), dtype_name(v.dtype()));
}

// Visits the rows (last dimension, stride 1) of a rank-1..3 view in row-major order.
template <class F>
void for_each_row(const TensorView& v, F&& f) {
  HYDRA_ASSERT(v.rank() >= 1 && v.rank() <= 3 && v.stride(v.rank() - 1) == 1,
               "row iteration needs rank 1..3 with unit last stride, got {}", v.shape_string());
  char* base = static_cast<char*>(v.data());
  const int64_t es = static_cast<int64_t>(v.element_size());
  if (v.rank() == 1) {
    f(int64_t{0}, base);
  } else if (v.rank() == 2) {
    for (int64_t i = 0; i < v.size(0); ++i) f(i, base + i * v.stride(0) * es);
  } else {
    int64_t row = 0;
    for (int64_t i = 0; i < v.size(0); ++i)
      for (int64_t j = 0; j < v.size(1); ++j) f(row++, base + (i * v.stride(0) + j * v.stride(1)) * es);
  }
}

// Number of rows and row length of a view visited by for_each_row.
inline int64_t row_count(const TensorView& v) { return v.numel() / v.size(v.rank() - 1); }
inline int64_t row_length(const TensorView& v) { return v.size(v.rank() - 1); }

inline bool same_rows(const TensorView& a, const TensorView& b) {
  if (a.rank() != b.rank()) return false;
  for (int d = 0; d < a.rank(); ++d)
    if (a.size(d) != b.size(d)) return false;
  return true;
}

}  // namespace hydra::ops
