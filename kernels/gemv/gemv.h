// The decode step's projections as a bandwidth-bound GEMV: out [M, N] (+)= x [M, K] · wᵀ, w [N, K]
// (the model's weight slots, stored [out, in] as ops::linear takes them), for a few rows M ≤
// kGemvMaxRows (the sequences of one decode step). A decode step reads every weight once per token;
// at these M the product is a stream of the weights, and the kernel is written to keep that stream
// at the card's bandwidth (gemv.cu says how), where cuBLAS's skinny GEMMs reach about half of it
// for some of the model's shapes (issue 57's profile). fp32 accumulation, bf16 output rounded once;
// deterministic (no atomics: the same bits on every run).
//
// CPU: plain loops with float64 sums (the reference). CUDA: bf16 x, w and out whose rows start
// 16-byte aligned (gemv_supported); the model falls back to ops::linear (cuBLAS) otherwise.
// The model uses it in decode steps only, when the kernel option decode_gemv is `hydra`
// (kernels/kernel_options.h; default cublas until measured on a GPU).
#pragma once

#include <cstdint>

#include "kernels/accumulate.h"
#include "runtime/tensor.h"

namespace hydra::ops {

// The decode step's projection kernels: cuBLAS (ops::linear) or this folder's GEMV.
enum class DecodeGemvKernel { cublas, hydra };
const char* decode_gemv_kernel_name(DecodeGemvKernel kernel);

// The most rows (M) the GEMV takes.
inline constexpr int64_t kGemvMaxRows = 8;

// out [M, N] (+)= x [M, K] · wᵀ, w [N, K]; 1 ≤ M ≤ kGemvMaxRows; unit column strides (row strides
// may exceed the widths: column blocks of a fused projection). On the GPU the views must pass
// gemv_supported.
void gemv(const TensorView& out, const TensorView& x, const TensorView& w, Accumulate accumulate = Accumulate::no);

// Whether gemv takes these views on their device: on the host any float views of matching shapes;
// on the GPU bf16 x, w and out with M ≤ kGemvMaxRows, N, K ≥ 1, and x and w rows starting 16-byte
// aligned (data and row strides: the kernel's 16-byte loads). Decides before any work, so the caller
// can pick ops::linear instead.
bool gemv_supported(const TensorView& out, const TensorView& x, const TensorView& w);

#if HYDRA_CUDA
namespace cuda_impl {  // gemv.cu
void gemv(const TensorView& out, const TensorView& x, const TensorView& w, Accumulate accumulate);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
