// Matrix products. The model's projections are `linear` (y = x Wᵀ with W stored [out, in] as in HF
// checkpoints); `gemm` is the general form. CPU: OpenBLAS sgemm (fp32). CUDA: cuBLAS, bf16 or fp32
// operands with fp32 accumulation; the output may be bf16 or fp32 (e.g. fp32 logits).
// Views may have a row stride larger than their width (column blocks of a fused projection), the
// last dimension must be contiguous.
#pragma once

#include "kernels/accumulate.h"
#include "runtime/tensor.h"

namespace hydra::ops {

enum class Transpose { no, yes };

struct GemmParams {
  Transpose transpose_a = Transpose::no;
  Transpose transpose_b = Transpose::no;
  float alpha = 1.0f;
  float beta = 0.0f;  // out = alpha · op(a) op(b) + beta · out
};

// out [M, N] = alpha · op(a) · op(b) + beta · out.
void gemm(const TensorView& out, const TensorView& a, const TensorView& b, const GemmParams& params);

// out [M, N] (+)= x [M, K] · wᵀ, w [N, K].
void linear(const TensorView& out, const TensorView& x, const TensorView& w, Accumulate accumulate = Accumulate::no);

// Backward of `linear` (y = x Wᵀ): dx [M, K] (+)= dy [M, N] · w [N, K] (`dx_accumulate`) and
// dw [N, K] += dyᵀ · x. Either output may be an undefined view (not needed). On the GPU, dy, x and w
// are bf16; dw is fp32 (a weight gradient) and dx is bf16 or fp32.
void linear_backward(const TensorView& dx, const TensorView& dw, const TensorView& dy, const TensorView& x,
                     const TensorView& w, Accumulate dx_accumulate = Accumulate::no);

// Sets the CPU path's BLAS thread count (e.g. cores / ranks per node).
void set_cpu_threads(int threads);

#if HYDRA_CUDA
namespace cuda_impl {  // matmul.cu: cuBLAS
void gemm(const TensorView& out, const TensorView& a, const TensorView& b, const GemmParams& params);
// out[i] = alpha · op(a[i]) · op(b[i]) + beta · out[i] over the leading dimension (one launch).
void gemm_batched(const TensorView& out, const TensorView& a, const TensorView& b, const GemmParams& params);
// linear_backward for CUDA views: dx (+)= dy · w and dw += dyᵀ · x, two cuBLAS GEMMs (bf16 operands,
// fp32 accumulation; dw fp32 with beta = 1).
void linear_backward(const TensorView& dx, const TensorView& dw, const TensorView& dy, const TensorView& x,
                     const TensorView& w, Accumulate dx_accumulate);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
