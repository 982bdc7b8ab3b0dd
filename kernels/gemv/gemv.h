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
// The model uses it in decode steps only, when the kernel option decode_gemv is `hydra` or
// `hydra-norm` (kernels/kernel_options.h; default cublas until measured on a GPU). With hydra-norm
// the projections that read an RMS-normed input (in_proj, the MLP's gate/up) run gemv_rms_norm:
// the norm inside the GEMV, one launch instead of two, the same bits.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/accumulate.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "runtime/tensor.h"

namespace hydra::ops {

// The decode step's projection kernels: cuBLAS (ops::linear), this folder's GEMV, or the GEMV with
// the input norms fused (gemv_rms_norm) where a projection reads one.
enum class DecodeGemvKernel { cublas, hydra, hydra_norm };
const char* decode_gemv_kernel_name(DecodeGemvKernel kernel);

// What the CUDA kernel's CTAs prefetch into L2 before they wait for the previous kernel (programmatic
// dependent launch; gemv.cu): the lines of each lane's first slices (the original), or each CTA's 16
// rows of w whole (one bulk prefetch a row). The same bits either way.
enum class GemvPrefetch { first_slices, tile };
const char* gemv_prefetch_name(GemvPrefetch prefetch);

// The CUDA kernel's launch shape (gemv.cu), for timing variants in one run (hydra bench --op gemv)
// and for the decode step (KernelOptions::gemv_tuning): warps a CTA (0: 16 when the grid has fewer
// than two CTAs an SM, else 8; or 4, 8, 16 — fewer when K has fewer 32-wide slices), 16-byte copies
// in flight a lane (4 or 8), and the prefetch. The warp count changes the order of the fp32 sums (a
// different rounding within gemv's bound); ahead and prefetch change nothing in the result.
struct GemvTuning {
  int warps = 0;
  int ahead = 4;
  GemvPrefetch prefetch = GemvPrefetch::first_slices;
  bool operator==(const GemvTuning&) const = default;
};
// "warps=8,ahead=8,prefetch=tile" (any subset, the rest default); "default" or "" gives {}. Throws a
// UserError naming the bad part.
GemvTuning parse_gemv_tuning(const std::string& text);
std::string gemv_tuning_name(const GemvTuning& tuning);

// The most rows (M) the GEMV takes.
inline constexpr int64_t kGemvMaxRows = 8;

// out [M, N] (+)= x [M, K] · wᵀ, w [N, K]; 1 ≤ M ≤ kGemvMaxRows; unit column strides (row strides
// may exceed the widths: column blocks of a fused projection). On the GPU the views must pass
// gemv_supported.
void gemv(const TensorView& out, const TensorView& x, const TensorView& w, Accumulate accumulate = Accumulate::no,
          const GemvTuning& tuning = {});

// Whether gemv takes these views on their device: on the host any float views of matching shapes;
// on the GPU bf16 x, w and out with M ≤ kGemvMaxRows, N, K ≥ 1, and x and w rows starting 16-byte
// aligned (data and row strides: the kernel's 16-byte loads). Decides before any work, so the caller
// can pick ops::linear instead.
bool gemv_supported(const TensorView& out, const TensorView& x, const TensorView& w);

// The input's RMS norm, applied by gemv_rms_norm before the product: x ← γ ⊙ x / rms(x).
struct GemvInputNorm {
  TensorView gamma;  // [K] (fp32 on the GPU)
  RmsNormParams params;
};

// out [M, N] = rms_norm(x; γ) · wᵀ, x [M, K] (the rows to norm, e.g. the residual stream), the normed
// rows rounded to x's dtype where ops::rms_norm writes them: the result has the bits of ops::rms_norm
// into an [M, K] buffer then gemv (the CPU runs exactly that; the GPU computes the norm inside each
// CTA). out as for gemv (on the GPU: bf16 [M, N], unit column stride); x and w must pass
// gemv_rms_norm_supported.
void gemv_rms_norm(const TensorView& out, const TensorView& x, const GemvInputNorm& norm, const TensorView& w,
                   const GemvTuning& tuning = {});

// Whether gemv_rms_norm takes x, γ and w on their device: on the host any float views of matching
// shapes; on the GPU what gemv_supported asks of x and w, γ fp32 contiguous and 16-byte aligned, and
// rows of K the RMSNorm's vector kernel takes (kernels/rmsnorm/rms_vector.h: K = 8·2^j ≤ 2048, or
// 4096), whose arithmetic the fused norm repeats; other widths keep the separate norm.
bool gemv_rms_norm_supported(const TensorView& x, const TensorView& gamma, const TensorView& w);

#if HYDRA_CUDA
namespace cuda_impl {  // gemv.cu; norm: the fused input norm, or nullptr
void gemv(const TensorView& out, const TensorView& x, const TensorView& w, Accumulate accumulate,
          const GemvInputNorm* norm = nullptr, const GemvTuning& tuning = {});
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
