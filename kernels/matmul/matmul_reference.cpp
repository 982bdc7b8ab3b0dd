// The CPU reference of the GEMM (matmul.h): OpenBLAS sgemm or dgemm; called by the entry point
// (matmul.cpp) for host tensors once shapes are checked.
#include "kernels/matmul/matmul_reference.h"

#include <cblas.h>

#include <type_traits>

#include "kernels/common.h"

namespace hydra::ops::reference {
namespace {

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

void gemm(const TensorView& out, const TensorView& a, const TensorView& b, const GemmParams& p, int64_t m, int64_t n,
          int64_t k) {
  with_host_float({{out, "gemm out"}, {a, "gemm a"}, {b, "gemm b"}},
                  [&](auto zero) { gemm_cpu<decltype(zero)>(out, a, b, p, m, n, k); });
}

void set_cpu_threads(int threads) { openblas_set_num_threads(threads < 1 ? 1 : threads); }

}  // namespace hydra::ops::reference
