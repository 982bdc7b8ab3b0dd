#include "kernels/matmul/matmul.h"

#include <cblas.h>

#include "kernels/common.h"

namespace hydra::ops {
namespace {
void expect_matrix(const TensorView& m, const char* what) {
  HYDRA_ASSERT(m.rank() == 2 && m.stride(1) == 1 && m.stride(0) >= m.size(1),
               "{} must be a row-major matrix with unit column stride, got shape {}", what, m.shape_string());
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
  if (on_cuda({out, a, b})) {
#if HYDRA_CUDA
    cuda_impl::gemm(out, a, b, p);
    return;
#endif
  }
  expect_host_f32(out, "gemm out");
  expect_host_f32(a, "gemm a");
  expect_host_f32(b, "gemm b");
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // BLAS leaves beta·C; with beta == 0 it must still clear C.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        float* c = static_cast<float*>(out.element_ptr({i, j}));
        *c = p.beta == 0.0f ? 0.0f : p.beta * *c;
      }
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), p.alpha, a.data_as<const float>(),
              static_cast<int>(a.stride(0)), b.data_as<const float>(), static_cast<int>(b.stride(0)), p.beta,
              out.data_as<float>(), static_cast<int>(out.stride(0)));
}

void linear(const TensorView& out, const TensorView& x, const TensorView& w, Accumulate accumulate) {
  gemm(out, x, w, GemmParams{.transpose_b = Transpose::yes, .beta = accumulate == Accumulate::yes ? 1.0f : 0.0f});
}

void set_cpu_threads(int threads) { openblas_set_num_threads(threads < 1 ? 1 : threads); }

}  // namespace hydra::ops
