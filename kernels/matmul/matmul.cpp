// The GEMM's entry point and the linear layer built on it: shape checks, then cuBLAS (tensors on the
// GPU, matmul.cu) or the CPU reference (host tensors, matmul_reference.cpp, OpenBLAS).
#include "kernels/matmul/matmul.h"

#include "kernels/common.h"
#include "kernels/matmul/matmul_reference.h"

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
  if (shapes_only({out, a, b})) return;
  if (on_cuda({out, a, b})) {
#if HYDRA_CUDA
    cuda_impl::gemm(out, a, b, p);
    return;
#endif
  }
  reference::gemm(out, a, b, p, m, n, k);
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

void set_cpu_threads(int threads) { reference::set_cpu_threads(threads); }

}  // namespace hydra::ops
