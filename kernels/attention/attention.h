// Softmax attention of a block of queries against a block of keys, returning the normalised output
// and the per-query log-sum-exp, so partial results over different key blocks (ring attention,
// DESIGN.md §3.2) merge exactly: o = Σ_b e^{lse_b − lse} o_b with lse = log Σ_b e^{lse_b}.
//
// Masking is positional, never materialised: row i of q sits at global position q_position0 + i,
// row j of k at k_position0 + j; with Causality::causal key j is visible to query i iff its
// position is ≤ the query's. This one rule covers the causal diagonal block, full blocks, empty
// blocks and the half blocks of the zigzag layout. GQA maps query head h to KV head
// kv_head_of_query[h] (default h / (Hq / Hk)).
//
// HydraHead FA heads (DESIGN.md §1.2) scale each query by τ(i) = ln(i + a) / ln(a) at its global position;
// tau_log_base = a > 0 switches that on (fused into the query load, q itself is unchanged).
//
// Packed documents (DESIGN.md §3.6): q_document_start gives each query row the global position of
// its document's first token s(q); keys before it are hidden and τ is taken at q − s(q). The rule
// is kernels/attention/attention_mask.h's, shared by every implementation. k_document_end (the
// backward, optional) gives each key row one past its document's last position, so the kernel can
// stop at the last query that sees a key block. On the GPU only the mma.sync kernels take
// documents; calls with them run those.
#pragma once

#include <cstdint>
#include <span>

#include "runtime/buffer_spec.h"
#include "runtime/tensor.h"

namespace hydra::ops {

enum class Causality { causal, none };
// overwrite: (out, lse) ← this block's result. merge: (out, lse) hold an earlier partial result
// (lse = −inf where none) which is merged with this block's, in fp32 (ring attention's steps).
enum class AttentionOutput { overwrite, merge };

// Which CUDA kernel runs a call (the CPU path ignores both; launch/ reads them from the environment
// once, README "Kernel options"). automatic: the fastest the device and shape allow.
//   forward:  hopper (warp-specialised TMA/wgmma, d = 128, sm_90) | mma (mma.sync, any sm_80+, d 64/128);
//   backward: ws (warp-specialised, d = 128, compute capability 9.x) | mma (mma.sync, any GPU, blocks
//             of 128 keys) | mma_k64 (mma.sync, blocks of 64 keys, d = 64; automatic with packed
//             documents at d = 64: attention_backward.cu says why).
// A kernel the shape cannot run falls back to mma (d = 64 for ws, d = 128 for mma_k64, packed
// documents for hopper/ws, views TMA cannot describe).
enum class AttentionKernel { automatic, hopper, mma };
enum class AttentionBackwardKernel { automatic, ws, mma, mma_k64 };
const char* attention_kernel_name(AttentionKernel kernel);
const char* attention_backward_kernel_name(AttentionBackwardKernel kernel);
struct AttentionParams {
  float scale = 0.0f;  // softmax scale; 0 means 1/sqrt(d)
  Causality causality = Causality::causal;
  int64_t q_position0 = 0;
  int64_t k_position0 = 0;
  double tau_log_base = 0.0;
  std::span<const int> kv_head_of_query = {};  // size Hq, or empty for h / (Hq / Hk)
  AttentionOutput output = AttentionOutput::overwrite;
  AttentionKernel forward_kernel = AttentionKernel::automatic;
  AttentionBackwardKernel backward_kernel = AttentionBackwardKernel::automatic;
  int decode_ctas_per_sm = 0;  // decode attention on the GPU: split CTAs per SM (0: as many as fit at once)
  bool decode_kv_evict_first = false;  // decode attention on the GPU: cache loads marked L2 evict-first
  TensorView q_document_start = {};  // [Tq] int64 on q's device, or undefined: one document (causal only)
  TensorView k_document_end = {};    // [Tk] int64, or undefined (the backward then scans to the last query)
};

// out [Tq, Hq, dv], lse [Hq, Tq] (fp32; −inf and out = 0 where no key is visible),
// q [Tq, Hq, d], k [Tk, Hk, d], v [Tk, Hk, dv]. CPU: all fp32. CUDA: q, k, v bf16, out fp32 (the
// merge accumulator), d = dv ∈ {64, 128}, rows 16-byte aligned.
void attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                       const TensorView& v, const AttentionParams& params);

// What attention_forward with AttentionOutput::merge allocates on the host: the CPU computes the
// block on its own into these, then merges them (attention_merge); the CUDA kernel merges in its
// epilogue and allocates nothing. For out [Tq, Hq, dv] of type `acc` (the ring's merge
// accumulator). A shape-only run (the memory plans) holds them on the host as the CPU does.
struct AttentionMergeBuffers {
  BufferSpec part;      // [Tq, Hq, dv], acc
  BufferSpec part_lse;  // [Hq, Tq], acc
};
AttentionMergeBuffers attention_merge_buffers(int64_t tq, int64_t hq, int64_t dv, DType acc);

// Merges a partial result into the running one, in place: (out, lse) ← merge((out, lse), (part_out, part_lse)).
// out/part_out [Tq, Hq, dv], lse/part_lse [Hq, Tq].
void attention_merge(const TensorView& out, const TensorView& lse, const TensorView& part_out,
                     const TensorView& part_lse);

// Backward (FlashAttention-2's recomputation scheme). Once per query block, before any key block:
//   delta [Hq, Tq] = rowsum(d_out ⊙ out) (fp32), from the FINAL output (merged over every key block).
void attention_backward_prepare(const TensorView& delta, const TensorView& d_out, const TensorView& out);

// Gradients of one (query block, key block) pair given the queries' final lse and delta; P is
// recomputed, never stored. With s_ij = scale τ_i q_i·k_j (masked as the forward):
//   P_ij = exp(s_ij − lse_i),  dV_j += Σ_i P_ij dO_i,  dP_ij = dO_i·V_j,  dS_ij = P_ij (dP_ij − D_i),
//   dQ_i += scale τ_i Σ_j dS_ij K_j,  dK_j += scale Σ_i dS_ij τ_i Q_i.
// Summing this over every key block (ring steps) gives the exact gradient of the merged forward.
// dq [Tq, Hq, d], dk [Tk, Hk, d], dv [Tk, Hk, dv]: fp32 accumulators (+=); GQA sums the query heads
// of a KV head into its dk/dv. d_out [Tq, Hq, dv], q, k, v as the forward (CUDA: bf16), lse, delta
// [Hq, Tq] fp32. params: the forward's (scale, causality, positions, τ, GQA map); `output` is unused.
void attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& d_out,
                        const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& lse,
                        const TensorView& delta, const AttentionParams& params);

#if HYDRA_CUDA
namespace cuda_impl {  // attention.cu: flash attention forward with fused merge
void attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                       const TensorView& v, const AttentionParams& params);
// The forward kernel a call with params.forward_kernel = `kernel` runs at this head dim on the
// current device (a kernel the device cannot run is an error at the call).
AttentionKernel resolve_flash_kernel(AttentionKernel kernel, int64_t head_dim);
// Whether the current device can run `kernel` (not automatic) at this head dim.
bool flash_kernel_supported(AttentionKernel kernel, int64_t head_dim);
// attention_backward.cu: D = rowsum(dO ⊙ O) and the flash-attention backward
void attention_backward_prepare(const TensorView& delta, const TensorView& d_out, const TensorView& out);
void attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& d_out,
                        const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& lse,
                        const TensorView& delta, const AttentionParams& params);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
