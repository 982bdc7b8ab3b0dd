#include "parallel/ring_attention.h"

#include <limits>

namespace hydra {

void ring_attention(Communicator& comm, const SequenceLayout& layout, const TensorView& out, const TensorView& lse,
                    const TensorView& q, const TensorView& k, const TensorView& v, const ops::AttentionParams& params,
                    PhaseTimer* timer) {
  const int64_t t_local = layout.local_length();
  expect_shape(q, "ring q", {{"T_loc", t_local}, {"Hq", -1}, {"d", -1}});
  expect_shape(k, "ring k", {{"T_loc", t_local}, {"Hk", -1}, {"d", q.size(2)}});
  expect_shape(v, "ring v", {{"T_loc", t_local}, {"Hk", k.size(1)}, {"dv", -1}});
  expect_shape(out, "ring out", {{"T_loc", t_local}, {"Hq", q.size(1)}, {"dv", v.size(2)}});
  expect_shape(lse, "ring lse", {{"Hq", q.size(1)}, {"T_loc", t_local}});
  HYDRA_ASSERT(comm.size() == layout.world_size(), "communicator of {} ranks, layout of {}", comm.size(),
               layout.world_size());
  const int world = comm.size(), rank = comm.rank();
  const int64_t hk = k.size(1), d = k.size(2), dv = v.size(2);
  const Device device = q.device();
  const DType dtype = k.dtype();
  if (world == 1) {  // the whole sequence is local: one causal pass, no copies
    ops::AttentionParams p = params;
    p.q_position0 = p.k_position0 = 0;
    p.output = ops::AttentionOutput::overwrite;
    ScopedPhase phase(timer, Phase::fa);
    ops::attention_forward(out, lse, q, k, v, p);
    return;
  }

  // K/V travel together: buffer [T_loc, Hk, d + dv], K in the first d columns of each head row.
  Tensor buffers[2] = {Tensor::empty({t_local, hk, d + dv}, dtype, device),
                       Tensor::empty({t_local, hk, d + dv}, dtype, device)};
  {
    ScopedPhase phase(timer, Phase::other);
    copy_into(buffers[0].view().narrow(2, 0, d), k);
    copy_into(buffers[0].view().narrow(2, d, dv), v);
  }

  fill(out, 0.0f);
  fill(lse, -std::numeric_limits<float>::infinity());
  for (int step = 0; step < world; ++step) {
    const int src = (rank - step + world) % world;
    const TensorView held = buffers[step % 2];
    std::unique_ptr<Transfer> transfer;
    if (step + 1 < world) {
      // Overlap: the next block is in flight while this one is computed.
      transfer = comm.start_send_recv(held, (rank + 1) % world, buffers[(step + 1) % 2], (rank - 1 + world) % world);
    }
    for (const Segment& qs : layout.local_segments()) {
      for (const Segment& ks : layout.segments_of(src)) {
        if (params.causality == ops::Causality::causal && ks.start > qs.start + qs.length - 1) continue;  // future
        ops::AttentionParams p = params;
        p.q_position0 = qs.start;
        p.k_position0 = ks.start;
        p.output = ops::AttentionOutput::merge;
        const TensorView kv = held.narrow(0, ks.local_offset, ks.length);
        ScopedPhase phase(timer, Phase::fa);
        ops::attention_forward(out.narrow(0, qs.local_offset, qs.length), lse.narrow(1, qs.local_offset, qs.length),
                               q.narrow(0, qs.local_offset, qs.length), kv.narrow(2, 0, d), kv.narrow(2, d, dv), p);
      }
    }
    if (transfer) {
      ScopedPhase phase(timer, Phase::comm);
      transfer->wait();
    }
  }
}

}  // namespace hydra
