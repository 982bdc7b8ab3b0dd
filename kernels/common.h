// Helpers shared by the ops' CPU implementations and dispatchers.
//
// Every op is one function taking views; it checks shapes, then dispatches on the device of its
// output: host views run the CPU implementation in the op's folder (the reference the CUDA kernel
// is tested against), CUDA views run the launcher in the op's .cu file. Meta views (a memory plan's
// shape-only run, runtime/memory_timeline.h) run nothing: after its shape checks an op returns
// (shapes_only), holding first, from the launcher's own spec, any workspace its GPU launcher
// allocates, so the plan of a pass holds what the pass holds. CPU implementations are
// templates on the element type T: float (the fp32 reference, DESIGN.md §2) or double (float64, for
// gradient checks by finite differences and whole-model gradient tests); every float view of one
// call has the same type (integer views such as token ids and positions keep theirs).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

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

// Whether any defined view is meta: the op's call is part of a shape-only run and computes nothing.
inline bool shapes_only(std::initializer_list<TensorView> views) {
  for (const TensorView& v : views) {
    if (v.defined() && v.is_meta()) return true;
  }
  return false;
}

// A view and its name for error messages.
struct Named {
  TensorView view;
  const char* what;
};

// The element type of a CPU implementation's float views: all must be host float32 or all host
// float64 (undefined views, i.e. optional outputs, are skipped). Anything else is an internal
// error naming the view.
inline DType expect_host_float(std::initializer_list<Named> views) {
  const Named* first = nullptr;
  for (const Named& v : views) {
    if (!v.view.defined()) continue;
    HYDRA_ASSERT(v.view.on_host() && (v.view.dtype() == DType::f32 || v.view.dtype() == DType::f64),
                 "{} must be a host float32 or float64 tensor (is {} {})", v.what, device_name(v.view.device()),
                 dtype_name(v.view.dtype()));
    if (!first) first = &v;
    HYDRA_ASSERT(v.view.dtype() == first->view.dtype(), "{} is {} but {} is {}: one element type per op call",
                 v.what, dtype_name(v.view.dtype()), first->what, dtype_name(first->view.dtype()));
  }
  return first ? first->view.dtype() : DType::f32;
}

// Checks the views as expect_host_float does, then calls f(T{}) with T = float or double, their
// element type: `with_host_float({{x, "x"}, ...}, [&](auto zero) { impl<decltype(zero)>(...); })`.
template <class F>
void with_host_float(std::initializer_list<Named> views, F&& f) {
  if (expect_host_float(views) == DType::f64) {
    f(double{});
  } else {
    f(float{});
  }
}

// Typed pointer to element (i0, i1, ...) of a host view (the type is checked by the caller's
// expect_host_float).
template <class T>
T* at(const TensorView& v, std::initializer_list<int64_t> index) {
  return static_cast<T*>(v.element_ptr(index));
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

// Row start addresses of a view, in for_each_row's order (to walk two views' rows together).
inline std::vector<char*> row_pointers(const TensorView& v) {
  std::vector<char*> rows;
  rows.reserve(static_cast<size_t>(row_count(v)));
  for_each_row(v, [&](int64_t, char* row) { rows.push_back(row); });
  return rows;
}

inline bool same_rows(const TensorView& a, const TensorView& b) {
  if (a.rank() != b.rank()) return false;
  for (int d = 0; d < a.rank(); ++d)
    if (a.size(d) != b.size(d)) return false;
  return true;
}

}  // namespace hydra::ops
