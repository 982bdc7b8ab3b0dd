#include "kernels/matmul/matmul.h"

#include <cblas.h>

#include <type_traits>

#include "kernels/common.h"

namespace hydra::ops {
namespace {
void expect_matrix(const TensorView& m, const char* what) {
  HYDRA_ASSERT(m.rank() == 2 && m.stride(1) == 1 && m.stride(0) >= m.size(1),
               "{} must be a row-major matrix with unit column stride, got shape {}", what, m.shape_string());
}

// OpenBLAS sgemm (float) or dgemm (double).
template <class T>
void gemm_cpu(const TensorView& out, const TensorView& a, const TensorView& b, const GemmParams& p, int64_t m,
              int64_t n, int64_t k) {
  const bool ta = p.transpose_a == Transpose::yes, tb = p.transpose_b == Transpose::yes;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // BLAS leaves beta·C; with beta == 0 it must still clear C.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        T* c = at<T>(out, {i, j});
        *c = p.beta == 0.0f ? T(0) : static_cast<T>(p.beta) * *c;
      }
    return;
  }
  const auto blas = [](auto... args) {
    if constexpr (std::is_same_v<T, float>) {
      cblas_sgemm(args...);
    } else {
      cblas_dgemm(args...);
    }
  };
  blas(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
       static_cast<int>(n), static_cast<int>(k), static_cast<T>(p.alpha), a.data_as<const T>(),
       static_cast<int>(a.stride(0)), b.data_as<const T>(), static_cast<int>(b.stride(0)), static_cast<T>(p.beta),
       out.data_as<T>(), static_cast<int>(out.stride(0)));
}
}  // namespace

void gemm(const TensorView& out, const TensorView& a, const TensorView& b, const GemmParams& p) {
  expect_matrix(out, "gemm out");
  expect_matrix(a, "gemm a");
  expect_matrix(b, "gemm b");
  const bool ta = p.transpose_a == Transpose::yes, tb = p.transpose_b == Transpose::yes;
  const int64_t m = ta ? a.size(1) : a.size(0);
  const int64_t k = ta ? a.size(0) : a.size(1);
  const int64_t kb = tb ? b.size(1) : b.size(0);
  const int64_t n = tb ? b.size(0) : b.size(1);
  HYDRA_ASSERT(k == kb && out.size(0) == m && out.size(1) == n, "gemm shapes: out {} = op(a {}) op(b {})",
               out.shape_string(), a.shape_string(), b.shape_string());
  if (shapes_only({out, a, b})) return;
  if (on_cuda({out, a, b})) {
#if HYDRA_CUDA
    cuda_impl::gemm(out, a, b, p);
    return;
#endif
  }
  with_host_float({{out, "gemm out"}, {a, "gemm a"}, {b, "gemm b"}},
                  [&](auto zero) { gemm_cpu<decltype(zero)>(out, a, b, p, m, n, k); });
}

void linear(const TensorView& out, const TensorView& x, const TensorView& w, Accumulate accumulate) {
  gemm(out, x, w, GemmParams{.transpose_b = Transpose::yes, .beta = accumulate == Accumulate::yes ? 1.0f : 0.0f});
}

// Both products go through gemm, which picks the device and element type.
void linear_backward(const TensorView& dx, const TensorView& dw, const TensorView& dy, const TensorView& x,
                     const TensorView& w, Accumulate dx_accumulate) {
  expect_shape(dy, "linear dy", {{"M", -1}, {"N", -1}});
  const int64_t rows = dy.size(0), outs = dy.size(1);
  if (dx.defined()) {
    expect_shape(w, "linear w", {{"N", outs}, {"K", -1}});
    expect_shape(dx, "linear dx", {{"M", rows}, {"K", w.size(1)}});
    gemm(dx, dy, w, GemmParams{.beta = dx_accumulate == Accumulate::yes ? 1.0f : 0.0f});
  }
  if (dw.defined()) {
    expect_shape(x, "linear x", {{"M", rows}, {"K", -1}});
    expect_shape(dw, "linear dw", {{"N", outs}, {"K", x.size(1)}});
    gemm(dw, dy, x, GemmParams{.transpose_a = Transpose::yes, .beta = 1.0f});
  }
}

void set_cpu_threads(int threads) { openblas_set_num_threads(threads < 1 ? 1 : threads); }

}  // namespace hydra::ops
