// Attention of a decode step (generation, model/kv_cache.h): one new query row per sequence against
// that sequence's key/value cache, and the ops around it.
//
// The cache of one layer is [S, capacity, Hk, d] (keys) and [S, capacity, Hk, dv] (values): S slots,
// one per sequence, each holding its first lengths[b] rows. Every cached key is visible to the new
// query (the cache holds only earlier positions and the query's own key, appended before the call),
// so there is no mask; the order of the rows does not matter (softmax over a set), which lets the
// sequence-parallel cache keep each rank's zigzag rows and round-robin appends in any order.
// Row b of the step reads slot slots[b]. τ(position) of the HydraHead FA heads scales the query as
// in attention.h (params.tau_log_base > 0), at the row's true position q_positions[b].
//
// Results are (out, lse) in the ring's convention (attention.h): out normalised, lse = log Σ e^{s},
// fp32, −inf and out = 0 where no key is visible; partial results over disjoint key sets merge
// exactly with attention_merge_partials (the same formula as attention_merge).
//
// CUDA (attention_decode.cu) is flash decoding: the keys of each (row, KV head) are split into
// chunks processed by separate CTAs, each CTA serving every query head of its KV head (GQA: the
// cache is read once per KV head), and the chunks' partial (out, lse) merged by
// attention_merge_partials. q, caches bf16; d = dv ∈ {64, 128}. params.decode_ctas_per_sm sizes the
// chunks.
#pragma once

#include "kernels/attention/attention.h"
#include "runtime/tensor.h"

namespace hydra::ops {

// out [B, Hq, dv] fp32 (acc type on the CPU), lse [Hq, B]; q [B, Hq, d]; k_cache [S, cap, Hk, d],
// v_cache [S, cap, Hk, dv]; slots [B] int32 (undefined: row b reads slot b); lengths [B] int32
// (keys visible to row b, ≤ cap) and max_length ≥ every one of them (known on the host: the GPU sizes
// its key chunks by it without reading `lengths` back); q_positions [B] int64 (for τ; may be
// undefined without τ).
// params: scale, tau_log_base, kv_head_of_query as in attention.h, decode_ctas_per_sm (the GPU's
// chunking); causality and positions unused.
void attention_decode(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k_cache,
                      const TensorView& v_cache, const TensorView& slots, const TensorView& lengths, int64_t max_length,
                      const TensorView& q_positions, const AttentionParams& params);

// Writes row b of k_new [B, Hk, d] / v_new [B, Hk, dv] into row rows[b] of slot slots[b] of the
// caches (rows [B] int32; −1 skips the row: another rank keeps that token). slots as above.
void kv_cache_append(const TensorView& k_cache, const TensorView& v_cache, const TensorView& k_new,
                     const TensorView& v_new, const TensorView& slots, const TensorView& rows);

// (out, lse) ← the merge of n partial results over disjoint key sets: part_out [n, B, Hq, dv],
// part_lse [n, Hq, B] → out [B, Hq, dv], lse [Hq, B] (fp32 on the GPU; the CPU folds the parts in
// order with attention_merge). Parts with lse = −inf contribute nothing.
void attention_merge_partials(const TensorView& out, const TensorView& lse, const TensorView& part_out,
                              const TensorView& part_lse);

#if HYDRA_CUDA
namespace cuda_impl {  // attention_decode.cu
void attention_decode(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k_cache,
                      const TensorView& v_cache, const TensorView& slots, const TensorView& lengths, int64_t max_length,
                      const TensorView& q_positions, const AttentionParams& params);
void kv_cache_append(const TensorView& k_cache, const TensorView& v_cache, const TensorView& k_new,
                     const TensorView& v_new, const TensorView& slots, const TensorView& rows);
void attention_merge_partials(const TensorView& out, const TensorView& lse, const TensorView& part_out,
                              const TensorView& part_lse);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
