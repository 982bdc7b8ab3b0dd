// Ring attention over the zigzag layout (DESIGN.md §3.2) for the FA heads.
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
#include "runtime/buffer_spec.h"
#include "runtime/phase_timer.h"

namespace hydra {

// The buffers the ring allocates, from which ring_attention and its backward allocate and the
// memory plan (model/memory_plan.cpp) prices: `total` tokens of the whole sequence, t_local of them
// here, Hq query and Hk KV heads of size d (dv = d in the backward), `dtype` the K/V storage type.
struct RingBuffers {
  BufferSpec bound;         // [T] i64: each of the documents' start and end per position (packed documents),
                            // built on the host and copied to the device
  BufferSpec kv;            // [T_loc, Hk, d + dv] dtype: the K/V held, and the K/V in flight
  BufferSpec kv_gradients;  // [2, T_loc, Hk, d] acc: the backward's dK/dV, fresh, carried and in flight
  BufferSpec delta;         // [Hq, T_loc] acc: the backward's rowsum(d_out ⊙ out)
};
RingBuffers ring_buffers(int64_t total, int64_t t_local, int64_t hq, int64_t hk, int64_t d, int64_t dv, DType dtype,
                         DType acc);

// out [T_loc, Hq, dv], lse [Hq, T_loc] (fp32: the merge accumulators); q [T_loc, Hq, d], k [T_loc, Hk, d], v [T_loc, Hk, dv], all in
// local row order. `params` gives scale, causality, τ and the GQA map; positions come from `layout`.
// `timer` (optional) gets the attention compute as Phase::fa and the waits for K/V as Phase::comm.
void ring_attention(Communicator& comm, const SequenceLayout& layout, const TensorView& out, const TensorView& lse,
                    const TensorView& q, const TensorView& k, const TensorView& v, const ops::AttentionParams& params,
                    PhaseTimer* timer = nullptr);

// Backward of ring_attention (DESIGN.md §1.5). D = rowsum(d_out ⊙ out) is computed once from the
// final output; K/V travel the ring again and their fp32 gradient accumulators ride along one step
// behind: at step s a rank computes the contribution of its queries to the held keys' dK/dV into a
// fresh buffer while the accumulator for those keys arrives from the previous rank, adds it and
// passes it on, so each accumulator collects every rank's contribution and arrives home after P
// hops. dQ accumulates locally. Every step uses the final (merged) lse.
// dq [T_loc, Hq, d], dk [T_loc, Hk, d], dv [T_loc, Hk, dv] (acc dtype, overwritten); d_out [T_loc, Hq, dv];
// q, k, v, out, lse as in (and from) the forward.
void ring_attention_backward(Communicator& comm, const SequenceLayout& layout, const TensorView& dq,
                             const TensorView& dk, const TensorView& dv, const TensorView& d_out,
                             const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                             const TensorView& lse, const ops::AttentionParams& params, PhaseTimer* timer = nullptr);

}  // namespace hydra
