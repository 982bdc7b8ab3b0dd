// The gated delta rule of the GDN heads (DESIGN.md §1.2) in the three forms the runtime needs.
//
// State S ∈ R^{dk×dv} per head (key × value), fp32. Per token, in order:
//   S ← e^{g_i} S;  δ = β_i (v_i − Sᵀk_i);  S ← S + k_i δᵀ;  o_i = Sᵀ (q_i · scale).
// Equivalently S_i = A_i S_{i−1} + β_i k_i v_iᵀ with A_i = e^{g_i}(I − β_i k_i k_iᵀ), so a segment of
// tokens maps any initial state affinely: S_out = M S_in + S_ext (M = A_n ⋯ A_1).
//
//  - recurrent: token by token, fp64 state internally: the oracle (CPU only).
//  - chunked: chunks of `chunk` tokens (WY/UT form): within a chunk, with γ the cumulative log-decay,
//      L_ij = β_i (k_i·k_j) e^{γ_i−γ_j} (j < i),  T = (I + L)⁻¹,
//      U = T (β ⊙ V),  W = T (β ⊙ e^{γ} ⊙ K),  V' = U − W S,
//      O = (e^{γ} ⊙ Q) S + ((Q Kᵀ) ⊙ D) V'  (D_ij = e^{γ_i−γ_j}, j ≤ i),
//      S ← e^{γ_C} S + (e^{γ_C−γ} ⊙ K)ᵀ V'.
//    Any length: the last chunk may be shorter. Initial state in, final state out.
//  - segment_map: (M, S_ext) of a segment, composed chunk by chunk:
//      M ← e^{γ_C} M − K̃ᵀ (W M),  S_ext ← e^{γ_C} S_ext + K̃ᵀ (U − W S_ext),  K̃ = e^{γ_C−γ} ⊙ K.
//    Sequence parallelism exchanges these maps instead of waiting for other ranks' scans.
// On the GPU (delta_rule_forward.cu and the stages of delta_rule_cuda.cuh) the chunked form and
// the maps take bf16 q/k/v rows, fp32 g/β and fp32 state, with dk = dv ∈ {64, 128} and chunk 64.
#pragma once

#include <cstdint>

#include "runtime/buffer_spec.h"
#include "runtime/tensor.h"

namespace hydra::ops {

// GPU measurement switch (the CPU forms ignore it): off, or print each stage's time (CUDA events,
// a synchronisation per call) to stderr; serial_stages also runs the backward's two concurrent
// passes one after the other to time them apart. launch/ reads it (HYDRA_GDN_PROFILE, README).
enum class GdnProfile { off, stages, serial_stages };

// The chunk length C of the chunked forms: the GPU kernels are built for it (delta_rule_cuda.cuh,
// delta_rule_backward.cuh), the memory and FLOP estimates count with it (model/cost.cpp); the CPU
// forms take any chunk (tests vary it).
inline constexpr int64_t kDeltaRuleChunk = 64;

// The GPU kernels' own workspaces (allocated in delta_rule_prepare.cu and delta_rule_backward.cu from
// these specs; in a shape-only run the dispatchers, delta_rule.cpp and delta_rule_backward.cpp, hold
// them in the launchers' order, the prepared chunks as one block, for the memory plans,
// model/memory_plan.h). The CPU reference keeps its per-chunk state in plain vectors instead. For `rows` rows of `heads` heads of size d, in chunks of
// C = kDeltaRuleChunk rows:
struct DeltaRulePrepareBuffers {
  BufferSpec gamma;          // [chunks, H, C] fp32: the decay prefix
  BufferSpec factors;        // [chunks, H, 4, C] fp32
  BufferSpec t;              // [chunks, H, C, C] bf16: the chunk's triangular solve
  BufferSpec p;              // [chunks, H, C, C] bf16: with queries only
  BufferSpec tile;           // [chunks, H, C, d] bf16: each of W, K̃, Q̂ (the backward's only)
  double bytes() const;      // every buffer that exists, the backward's three tiles included
};
DeltaRulePrepareBuffers delta_rule_prepare_buffers(int64_t rows, int64_t heads, int64_t d, bool queries, bool backward);
// delta_rule_backward.cu: the chunk states and v_new the backward recomputes, and their gradients.
struct DeltaRuleBackwardBuffers {
  BufferSpec states;  // [chunks, H, d, d] bf16 (and the gradient's)
  BufferSpec v_new;   // [chunks, H, C, d] bf16 (and the gradient's)
};
DeltaRuleBackwardBuffers delta_rule_backward_buffers(int64_t rows, int64_t heads, int64_t d);

// GPU kernels of the GDN branch's decode step (kernels/gdn_decode/gdn_decode.h; the CPU ignores the
// choice): separate, the production choice: the conv step, the gates and the delta-rule step as three
// launches; fused: one launch, a cluster of CTAs per (row, head) splitting the state's value columns.
enum class GdnDecodeKernel { separate, fused };
const char* gdn_decode_kernel_name(GdnDecodeKernel kernel);

struct DeltaRuleParams {
  float scale = 0.0f;  // query scale; 0 means 1/sqrt(dk)
  int64_t chunk = kDeltaRuleChunk;
  // GPU only: the in-GPU split of the sequential pass (0: enough segments to fill the GPU, from
  // the cost model in delta_rule_forward.cu; 1: no split), and the stage timing.
  int segments = 0;
  GdnProfile profile = GdnProfile::off;
  GdnDecodeKernel decode_kernel = GdnDecodeKernel::separate;  // ops::gdn_decode_step on the GPU
};

// out [T, H, dv]; state [H, dk, dv] (in: initial state, out: final state);
// q, k [T, H, dk]; v [T, H, dv]; g, beta [T, H].
void delta_rule_recurrent(const TensorView& out, const TensorView& state, const TensorView& q, const TensorView& k,
                          const TensorView& v, const TensorView& g, const TensorView& beta,
                          const DeltaRuleParams& params);
void delta_rule_chunked(const TensorView& out, const TensorView& state, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& g, const TensorView& beta,
                        const DeltaRuleParams& params);

// m [H, dk, dk], s_ext [H, dk, dv]: the segment (k, v, g, beta over T tokens) maps S_in to m·S_in + s_ext.
void delta_rule_segment_map(const TensorView& m, const TensorView& s_ext, const TensorView& k, const TensorView& v,
                            const TensorView& g, const TensorView& beta, const DeltaRuleParams& params);

// state [H, dk, dv] ← m · state + s_ext.
void delta_rule_apply_map(const TensorView& state, const TensorView& m, const TensorView& s_ext);

// ---- Backward (training, DESIGN.md §1.5) ----
// Backward of delta_rule_chunked over one segment that started from `state0` [H, dk, dv] (fp32):
//   in:  d_out [T, H, dv]; d_state [H, dk, dv] fp32 = the gradient w.r.t. the segment's FINAL state
//        (zeros when nothing after the segment reads it);
//   out: dq, dk [T, H, dk], dv [T, H, dv] (overwritten); dg, dbeta [T, H] fp32 (overwritten);
//        d_state ← the gradient w.r.t. the INITIAL state.
// The chunk states are recomputed from state0 (the forward keeps nothing but its inputs), then the
// state gradient runs backward over the chunks (flash-linear-attention's scheme).
// CUDA: q, k, v, d_out bf16; dq, dk, dv bf16 or fp32; g, beta, dg, dbeta, state0, d_state fp32.
void delta_rule_chunked_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                 const TensorView& dg, const TensorView& dbeta, const TensorView& d_state,
                                 const TensorView& d_out, const TensorView& q, const TensorView& k,
                                 const TensorView& v, const TensorView& g, const TensorView& beta,
                                 const TensorView& state0, const DeltaRuleParams& params);

// The state-gradient pass alone: d_state (in: gradient w.r.t. the final state, out: w.r.t. the
// initial state) through the segment, from its outputs' gradient d_out. It does not depend on v.
// Sequence parallelism runs it with zeros in to get each segment's own term dS_loc before the
// reverse fold; it is the transpose of the segment map's linear part plus the outputs' term.
void delta_rule_state_backward(const TensorView& d_state, const TensorView& d_out, const TensorView& q,
                               const TensorView& k, const TensorView& g, const TensorView& beta,
                               const DeltaRuleParams& params);

// d_state [H, dk, dv] ← mᵀ · d_state + d_loc: one step of the reverse fold dS_in = Mᵀ dS_out + dS_loc.
void delta_rule_apply_map_transposed(const TensorView& d_state, const TensorView& m, const TensorView& d_loc);

#if HYDRA_CUDA
namespace cuda_impl {  // delta_rule_forward.cu: chunked form and segment maps (bf16 q/k/v, fp32 g/β/state)
void delta_rule_chunked(const TensorView& out, const TensorView& state, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& g, const TensorView& beta, const DeltaRuleParams& params);
void delta_rule_segment_map(const TensorView& m, const TensorView& s_ext, const TensorView& k, const TensorView& v,
                            const TensorView& g, const TensorView& beta, const DeltaRuleParams& params);
void delta_rule_apply_map(const TensorView& state, const TensorView& m, const TensorView& s_ext);
// The segment fold of the chunked form (gdn::fold_maps in delta_rule_cuda.cuh), for its test:
// states[s+1] = M_s states[s] (+ add[s]), s < steps, fp32 [n, H, D, D] with contiguous slices.
void delta_rule_fold(const TensorView& m, const TensorView* add, const TensorView& states, int steps);
// delta_rule_backward.cu
void delta_rule_chunked_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                 const TensorView& dg, const TensorView& dbeta, const TensorView& d_state,
                                 const TensorView& d_out, const TensorView& q, const TensorView& k,
                                 const TensorView& v, const TensorView& g, const TensorView& beta,
                                 const TensorView& state0, const DeltaRuleParams& params);
void delta_rule_state_backward(const TensorView& d_state, const TensorView& d_out, const TensorView& q,
                               const TensorView& k, const TensorView& g, const TensorView& beta,
                               const DeltaRuleParams& params);
void delta_rule_apply_map_transposed(const TensorView& d_state, const TensorView& m, const TensorView& d_loc);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
