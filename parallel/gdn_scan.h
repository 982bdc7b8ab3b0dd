// Sequence-parallel GDN (DESIGN.md §3.3, §3.4): the recurrence crosses ranks through segment affine maps and
// the short conv through a halo, and no rank waits for another rank's scan.
//
// gdn_sequence_parallel:
//   1. each rank computes, per owned segment and head, the segment's map S_out = M·S_in + S_ext
//      (ops::delta_rule_segment_map, fp32); the map of the last global segment is never needed;
//   2. one all-gather exchanges every segment's maps;
//   3. each rank folds the maps of all earlier segments (in order) to get its segments' true
//      initial states, then runs the chunked form over its tokens.
// causal_conv_sequence_parallel: the last K−1 pre-conv rows of every segment are all-gathered;
// each segment's conv takes its predecessor's rows as prefix (zeros for segment 0). Segments must
// hold at least K−1 tokens.
#pragma once

#include "kernels/delta_rule/delta_rule.h"
#include "kernels/gdn_qk/gdn_qk.h"
#include "parallel/communicator.h"
#include "parallel/layout.h"
#include "runtime/buffer_spec.h"
#include "runtime/phase_timer.h"

namespace hydra {

// What the sequence-parallel GDN forward keeps for its backward (model.h LayerSaved): each local
// segment's true initial state and its own transition M, fp32 — nothing that grows with the rank
// count (the backward gathers the later segments' M with its state gradients, one collective).
// Undefined with one rank (the initial state is zero and there is nothing to fold).
struct GdnSaved {
  Tensor state0;  // [n_local, H, dk, dv]
  Tensor maps;    // [n_local, H·dk·dk]: M of each local segment (zero for the last global segment)
};

// The buffers of the sequence-parallel GDN scan (allocated from this spec, each allocation naming
// its buffer for the memory plans, model/memory_plan.h) on `world` ranks owning `nlocal` segments
// each, H heads, dk × dv states in the accumulator type:
struct GdnScanBuffers {
  BufferSpec state;            // [H, dk, dv]: the running state (forward), its gradient (backward)
  BufferSpec maps;             // [n_local, H·(dk·dk + dk·dv)]: this rank's segment maps (M, S_ext)
  BufferSpec gathered_maps;    // [P, n_local, H·(dk·dk + dk·dv)]: every segment's, during the forward
  BufferSpec kept_maps;        // [n_local, H·dk·dk]: the own segments' M, kept for the backward (GdnSaved::maps)
  BufferSpec initial_states;   // [n_local, H, dk, dv]: GdnSaved::state0
  BufferSpec state_gradients;  // [n_local, H·(dk·dv + dk·dk)]: the backward's own dS_loc per segment, M beside it
  BufferSpec gathered_state_gradients;  // [P, n_local, H·(dk·dv + dk·dk)]
};
GdnScanBuffers gdn_scan_buffers(int world, int nlocal, int64_t heads, int64_t dk, int64_t dv, DType acc);

// The conv halo (causal_conv_sequence_parallel and its backward): each owned segment's last K−1
// input rows of C channels, every rank's gathered, and a halo with another document's rows zeroed;
// the backward gathers the halo rows' gradients in the same shapes.
struct ConvHaloBuffers {
  BufferSpec halos;     // [n_local, K−1, C]
  BufferSpec gathered;  // [P, n_local, K−1, C]
  BufferSpec masked;    // [K−1, C]
};
ConvHaloBuffers conv_halo_buffers(int world, int nlocal, int64_t halo, int64_t channels, DType dtype);
// Whether segments of `segment_length` tokens can pass a conv halo of `halo` rows between `world`
// ranks (every segment must hold a whole halo); the one statement of the rule, which the conv checks
// and generation's prefill length (model/generate.cpp) obeys.
inline bool conv_halo_fits(int64_t segment_length, int64_t halo, int world) {
  return world == 1 || halo == 0 || segment_length >= halo;
}

// `timer` (optional): GDN compute as Phase::gdn, the collectives as Phase::comm.
// out [T_loc, H, dv]; q, k [T_loc, H, dk]; v [T_loc, H, dv]; g, beta [T_loc, H]; local row order.
// final_state [H, dk, dv] (optional, generation's cache): on the rank owning the last segment,
// receives the state after the sequence's last token; ignored elsewhere.
void gdn_sequence_parallel(Communicator& comm, const SequenceLayout& layout, const TensorView& out,
                           const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                           const TensorView& beta, const ops::DeltaRuleParams& params, PhaseTimer* timer = nullptr,
                           GdnSaved* saved = nullptr, const TensorView& final_state = TensorView());

// The forward's outputs again, from the initial states it kept (no collective): what the backward's
// recomputation of a layer runs. With one rank `saved` is empty and the initial state is zero.
void gdn_sequence_parallel_recompute(const SequenceLayout& layout, const GdnSaved& saved, const TensorView& out,
                                     const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& g, const TensorView& beta, const ops::DeltaRuleParams& params,
                                     PhaseTimer* timer = nullptr);

// Backward of gdn_sequence_parallel (DESIGN.md §1.5): the state gradient crosses segments in reverse.
//   1. each rank computes, per owned segment, dS_loc = the gradient its outputs send into the
//      segment's initial state with nothing arriving from later segments (delta_rule_state_backward);
//   2. one all-gather of the dS_loc, each beside its segment's M (kept by the forward);
//   3. each rank folds the suffix for its segments in fp32 with the transposed maps:
//      dS_in(j) = M_jᵀ dS_in(j+1) + dS_loc(j), so segment i's final state receives
//      dS_out(i) = dS_in(i+1); then runs the chunked backward of each owned segment from its kept
//      initial state with that incoming state gradient.
// dq, dk [T_loc, H, dk], dv [T_loc, H, dv], dg, dbeta [T_loc, H] are overwritten.
void gdn_sequence_parallel_backward(Communicator& comm, const SequenceLayout& layout, const GdnSaved& saved,
                                    const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                    const TensorView& dg, const TensorView& dbeta, const TensorView& d_out,
                                    const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& g, const TensorView& beta, const ops::DeltaRuleParams& params,
                                    PhaseTimer* timer = nullptr);

// The q/k finish fused into the conv (ops::gdn_qkv_conv): RoPE at `positions` [T_loc] and the L2
// norm of the first params.qk_heads heads, their inverse norms into inv_norm [T_loc, qk_heads].
struct GdnQkFinish {
  TensorView positions;
  TensorView inv_norm;
  ops::GdnQkParams params;
};

// out, x [T_loc, C] (local rows); w [C, K]. With `finish`, ops::gdn_qkv_conv instead of the plain
// conv + SiLU.
void causal_conv_sequence_parallel(Communicator& comm, const SequenceLayout& layout, const TensorView& out,
                                   const TensorView& x, const TensorView& w, PhaseTimer* timer = nullptr,
                                   const GdnQkFinish* finish = nullptr);

// Backward of causal_conv_sequence_parallel: dx [T_loc, C] overwritten, dw [C, K] accumulated (or
// undefined: frozen). The halo rows' gradient goes back to the rank that owns the previous segment
// (one all-gather) and is added to the last K−1 rows of that segment's dx.
void causal_conv_sequence_parallel_backward(Communicator& comm, const SequenceLayout& layout, const TensorView& dx,
                                            const TensorView& dw, const TensorView& d_out, const TensorView& x,
                                            const TensorView& w, PhaseTimer* timer = nullptr);

}  // namespace hydra
