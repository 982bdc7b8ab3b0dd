// Ring attention over the zigzag layout (SPEC 3) for the FA heads.
//
// Every rank starts with its own K/V rows (both segments) packed in one buffer. At step s it holds
// the K/V of rank (r − s) mod P; it posts the send of that buffer to rank r+1 and the receive of
// the next one from rank r−1 into the second buffer (double buffering), computes attention of its
// queries against the held keys while the transfer runs, then waits and swaps. Masks follow from
// global positions (ops::attention_forward), so block pairs that lie entirely in the future are
// skipped without a kernel launch and the zigzag half blocks need no special case. Partial results
// are merged in fp32 with their log-sum-exp; the final lse is returned for a backward pass.
#pragma once

#include "kernels/attention/attention.h"
#include "parallel/communicator.h"
#include "parallel/layout.h"
#include "runtime/phase_timer.h"

namespace hydra {

// out [T_loc, Hq, dv], lse [Hq, T_loc] (fp32: the merge accumulators); q [T_loc, Hq, d], k [T_loc, Hk, d], v [T_loc, Hk, dv], all in
// local row order. `params` gives scale, causality, τ and the GQA map; positions come from `layout`.
// `timer` (optional) gets the attention compute as Phase::fa and the waits for K/V as Phase::comm.
void ring_attention(Communicator& comm, const SequenceLayout& layout, const TensorView& out, const TensorView& lse,
                    const TensorView& q, const TensorView& k, const TensorView& v, const ops::AttentionParams& params,
                    PhaseTimer* timer = nullptr);

}  // namespace hydra
