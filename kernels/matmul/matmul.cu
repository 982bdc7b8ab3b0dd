// GEMMs on the GPU through cuBLAS: bf16 (or fp32) operands, fp32 accumulation, any output type
// cuBLAS allows (bf16 activations, fp32 logits). Row-major views map onto cuBLAS's column-major
// convention by computing outᵀ = op(b)ᵀ · op(a)ᵀ, so no operand is ever copied or transposed.
#include <cublas_v2.h>

#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/matmul/matmul.h"

namespace hydra::ops::cuda_impl {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::bf16: return CUDA_R_16BF;
    case DType::f32: return CUDA_R_32F;
    default: HYDRA_ASSERT(false, "cuBLAS GEMM of {}", dtype_name(t));
  }
  return CUDA_R_32F;
}

// One handle per thread, bound to the thread's current stream at each call.
cublasHandle_t handle() {
  thread_local cublasHandle_t h = [] {
    cublasHandle_t created;
    HYDRA_CUBLAS_CHECK(cublasCreate(&created));
    return created;
  }();
  HYDRA_CUBLAS_CHECK(cublasSetStream(h, current_stream()));
  return h;
}

}  // namespace

void gemm(const TensorView& out, const TensorView& a, const TensorView& b, const GemmParams& p) {
  HYDRA_ASSERT(a.dtype() == b.dtype(), "GEMM operands {} and {}", dtype_name(a.dtype()), dtype_name(b.dtype()));
  const bool ta = p.transpose_a == Transpose::yes, tb = p.transpose_b == Transpose::yes;
  const int64_t m = out.size(0), n = out.size(1), k = ta ? a.size(0) : a.size(1);
  if (m == 0 || n == 0) return;
  // fp32 operands: plain fp32 (no TF32), the GDN state precision; bf16 operands: fp32 accumulate.
  const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  HYDRA_CUBLAS_CHECK(cublasGemmEx(handle(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &p.alpha, b.data(),
                                  cuda_type(b.dtype()), static_cast<int>(b.stride(0)), a.data(), cuda_type(a.dtype()),
                                  static_cast<int>(a.stride(0)), &p.beta, out.data(), cuda_type(out.dtype()),
                                  static_cast<int>(out.stride(0)), compute, CUBLAS_GEMM_DEFAULT));
}

void gemm_batched(const TensorView& out, const TensorView& a, const TensorView& b, const GemmParams& p) {
  HYDRA_ASSERT(out.rank() == 3 && a.rank() == 3 && b.rank() == 3 && a.size(0) == out.size(0) && b.size(0) == out.size(0),
               "batched GEMM shapes {} {} {}", out.shape_string(), a.shape_string(), b.shape_string());
  for (const TensorView* t : {&out, &a, &b}) HYDRA_ASSERT(t->stride(2) == 1, "batched GEMM needs unit column strides");
  const bool ta = p.transpose_a == Transpose::yes, tb = p.transpose_b == Transpose::yes;
  const int64_t m = out.size(1), n = out.size(2), k = ta ? a.size(1) : a.size(2);
  HYDRA_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
      static_cast<int>(k), &p.alpha, b.data(), cuda_type(b.dtype()), static_cast<int>(b.stride(1)), b.stride(0), a.data(),
      cuda_type(a.dtype()), static_cast<int>(a.stride(1)), a.stride(0), &p.beta, out.data(), cuda_type(out.dtype()),
      static_cast<int>(out.stride(1)), out.stride(0), static_cast<int>(out.size(0)), CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

void linear_backward(const TensorView& dx, const TensorView& dw, const TensorView& dy, const TensorView& x,
                     const TensorView& w, Accumulate dx_accumulate) {
  // x is read only for dw and w only for dx: either may be undefined when its product is not wanted.
  const auto expect_operand = [](const TensorView& v, const char* what, int64_t rows, int64_t cols) {
    cuda::expect_cuda(v, what, DType::bf16);
    HYDRA_ASSERT(v.rank() == 2 && v.stride(1) == 1 && v.size(0) == rows && (cols < 0 || v.size(1) == cols),
                 "linear_backward {} must be a [{}, {}] matrix with unit column stride, got {}", what, rows,
                 cols < 0 ? std::string("any") : std::to_string(cols), v.shape_string());
  };
  HYDRA_ASSERT(dy.rank() == 2, "linear_backward dy must be [M, N], got {}", dy.shape_string());
  const int64_t m = dy.size(0), n = dy.size(1);
  expect_operand(dy, "dy", m, n);
  if (dx.defined()) {  // dx [M, K] (+)= dy [M, N] · w [N, K]
    expect_operand(w, "w", n, -1);
    HYDRA_ASSERT(dx.device() == Device::cuda && (dx.dtype() == DType::bf16 || dx.dtype() == DType::f32) &&
                     dx.rank() == 2 && dx.size(0) == m && dx.size(1) == w.size(1) && dx.stride(1) == 1,
                 "linear_backward dx must be a CUDA bf16/fp32 [{}, {}] matrix, got {} {}", m, w.size(1),
                 dtype_name(dx.dtype()), dx.shape_string());
    cuda_impl::gemm(dx, dy, w, GemmParams{.beta = dx_accumulate == Accumulate::yes ? 1.0f : 0.0f});
  }
  if (dw.defined()) {  // dw [N, K] += dyᵀ [N, M] · x [M, K]
    expect_operand(x, "x", m, -1);
    cuda::expect_cuda(dw, "linear_backward dw", DType::f32);
    HYDRA_ASSERT(dw.rank() == 2 && dw.size(0) == n && dw.size(1) == x.size(1) && dw.stride(1) == 1,
                 "linear_backward dw must be [{}, {}], got {}", n, x.size(1), dw.shape_string());
    if (m > 0) cuda_impl::gemm(dw, dy, x, GemmParams{.transpose_a = Transpose::yes, .beta = 1.0f});  // M = 0 adds 0
  }
}

}  // namespace hydra::ops::cuda_impl
