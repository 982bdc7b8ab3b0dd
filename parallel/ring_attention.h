// Ring attention over the zigzag layout (DESIGN.md §3.2) for the FA heads.
//
// Every rank starts with its own K/V rows (both segments) packed in one buffer. The ring's topology
// says which block a rank holds at each step and where blocks travel (ring_steps); the flat ring
// over the group's ranks is the one today: at step s rank r holds the K/V of rank (r − s) mod P. At
// each step a rank posts the send of the block it holds to the step's `next` and the receive of the
// next block from its `prev` into the second buffer (double buffering), computes attention of its
// queries against the held keys while the transfer runs, then waits and swaps. A two-level ring
// (within a node, then across nodes) is another RingTopology with its own ring_steps; the forward
// and the backward walk whatever steps it gives. Masks follow from
// global positions (ops::attention_forward), so block pairs that lie entirely in the future are
// skipped without a kernel launch and the zigzag half blocks need no special case. Partial results
// are merged in fp32 with their log-sum-exp; the final lse is returned for a backward pass.
#pragma once

#include <vector>

#include "kernels/attention/attention.h"
#include "parallel/communicator.h"
#include "parallel/layout.h"
#include "runtime/buffer_spec.h"
#include "runtime/phase_timer.h"

namespace hydra {

// How the K/V blocks travel around the ranks of a sequence group.
enum class RingTopology {
  flat,  // one ring over the group's ranks in rank order
};

// One step of a rank's walk: it holds the K/V of rank `source`; after the step what it holds goes to
// `next` and the next block (and, in the backward, the gradient accumulator for it) comes from `prev`.
// Over the P steps every rank's block is held exactly once, and what a rank holds at step s is what
// its `prev` held at step s − 1 (tests/parallel/sequence_parallel_test.cpp checks both of any topology).
struct RingStep {
  int source = 0;
  int next = 0;
  int prev = 0;
};
// The P steps of rank `rank` of `world` on `topology`: the one place where a ring's order is computed.
std::vector<RingStep> ring_steps(RingTopology topology, int world, int rank);

// The buffers the ring allocates, from which ring_attention and its backward allocate (each
// allocation naming its buffer for the memory plans, model/memory_plan.h): `total` tokens of the whole sequence, t_local of them
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
                    PhaseTimer* timer = nullptr, RingTopology topology = RingTopology::flat);

// Backward of ring_attention (DESIGN.md §1.5). D = rowsum(d_out ⊙ out) is computed once from the
// final output; K/V travel the ring again and their fp32 gradient accumulators ride along one step
// behind: at step s a rank computes the contribution of its queries to the held keys' dK/dV into a
// fresh buffer while the accumulator for those keys arrives from the step's `prev`, adds it and
// passes it on to `next`, so each accumulator collects every rank's contribution and arrives home
// after P hops. dQ accumulates locally. Every step uses the final (merged) lse.
// dq [T_loc, Hq, d], dk [T_loc, Hk, d], dv [T_loc, Hk, dv] (acc dtype, overwritten); d_out [T_loc, Hq, dv];
// q, k, v, out, lse as in (and from) the forward.
void ring_attention_backward(Communicator& comm, const SequenceLayout& layout, const TensorView& dq,
                             const TensorView& dk, const TensorView& dv, const TensorView& d_out,
                             const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                             const TensorView& lse, const ops::AttentionParams& params, PhaseTimer* timer = nullptr,
                             RingTopology topology = RingTopology::flat);

}  // namespace hydra
