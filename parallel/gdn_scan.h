// Sequence-parallel GDN (SPEC 3): the recurrence crosses ranks through segment affine maps and
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
#include "parallel/communicator.h"
#include "parallel/layout.h"
#include "runtime/phase_timer.h"

namespace hydra {

// `timer` (optional): GDN compute as Phase::gdn, the collectives as Phase::comm.
// out [T_loc, H, dv]; q, k [T_loc, H, dk]; v [T_loc, H, dv]; g, beta [T_loc, H]; local row order.
void gdn_sequence_parallel(Communicator& comm, const SequenceLayout& layout, const TensorView& out,
                           const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                           const TensorView& beta, const ops::DeltaRuleParams& params, PhaseTimer* timer = nullptr);

// out, x [T_loc, C] (local rows); w [C, K].
void causal_conv_sequence_parallel(Communicator& comm, const SequenceLayout& layout, const TensorView& out,
                                   const TensorView& x, const TensorView& w, PhaseTimer* timer = nullptr);

}  // namespace hydra
