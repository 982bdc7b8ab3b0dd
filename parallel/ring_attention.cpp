#include "parallel/ring_attention.h"

#include <limits>
#include <optional>

#include "kernels/attention/attention_mask.h"
#include "kernels/elementwise/elementwise.h"

namespace hydra {

RingBuffers ring_buffers(int64_t total, int64_t t_local, int64_t hq, int64_t hk, int64_t d, int64_t dv, DType dtype,
                         DType acc) {
  return {.bound = {{total}, DType::i64},
          .kv = {{t_local, hk, d + dv}, dtype},
          .kv_gradients = {{2, t_local, hk, d}, acc},
          .delta = {{hq, t_local}, acc}};
}

std::vector<RingStep> ring_steps(RingTopology topology, int world, int rank) {
  HYDRA_ASSERT(world >= 1 && rank >= 0 && rank < world, "ring of {} ranks, rank {}", world, rank);
  std::vector<RingStep> steps;
  switch (topology) {
    case RingTopology::flat:
      for (int s = 0; s < world; ++s) {
        steps.push_back({.source = (rank - s + world) % world, .next = (rank + 1) % world, .prev = (rank - 1 + world) % world});
      }
      break;
  }
  return steps;
}

namespace {

// Every global position's document start and end on `device` (int64 [T]), from which each
// (query segment, key segment) pair takes its rows; undefined when the sequence is one document.
struct PositionBounds {
  Tensor start, end;
};

PositionBounds position_bounds(const SequenceLayout& layout, Device device) {
  if (!layout.has_documents()) return {};
  const int64_t t = layout.total_length();
  const BufferSpec bound = ring_buffers(t, 0, 0, 0, 0, 0, DType::f32, DType::f32).bound;
  const MemoryLabel label{MemoryPart::workspaces, "document bounds"};
  Tensor start = bound.empty(Device::host, label), end = bound.empty(Device::host, label);
  const std::vector<int64_t>& starts = layout.document_starts();
  for (size_t d = 0; d < starts.size() && !start.is_meta(); ++d) {  // meta: a memory plan's shape-only run
    const int64_t b = starts[d], e = d + 1 < starts.size() ? starts[d + 1] : t;
    for (int64_t i = b; i < e; ++i) {
      start.data_as<int64_t>()[i] = b;
      end.data_as<int64_t>()[i] = e;
    }
  }
  return {to_device(start, device, label), to_device(end, device, label)};
}

// The parameters of one (query segment, key segment) pair, or nothing when no pair of positions is
// visible (attention_mask.h): then no kernel is launched.
std::optional<ops::AttentionParams> pair_params(const ops::AttentionParams& params, const SequenceLayout& layout,
                                                const PositionBounds& bounds, const Segment& qs, const Segment& ks) {
  const bool causal = params.causality == ops::Causality::causal;
  const int64_t q_hi = qs.start + qs.length - 1, k_hi = ks.start + ks.length - 1;
  if (!ops::mask::block_any(qs.start, q_hi, layout.document_start(qs.start), ks.start, k_hi, causal)) return {};
  ops::AttentionParams p = params;
  p.q_position0 = qs.start;
  p.k_position0 = ks.start;
  if (bounds.start.defined()) {
    p.q_document_start = bounds.start.view().narrow(0, qs.start, qs.length);
    p.k_document_end = bounds.end.view().narrow(0, ks.start, ks.length);
  }
  return p;
}

}  // namespace

void ring_attention(Communicator& comm, const SequenceLayout& layout, const TensorView& out, const TensorView& lse,
                    const TensorView& q, const TensorView& k, const TensorView& v, const ops::AttentionParams& params,
                    PhaseTimer* timer, RingTopology topology) {
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
  const PositionBounds bounds = position_bounds(layout, device);
  if (world == 1) {  // the whole sequence is local: one causal pass, no copies
    ops::AttentionParams p = params;
    p.q_position0 = p.k_position0 = 0;
    p.output = ops::AttentionOutput::overwrite;
    p.q_document_start = bounds.start;
    p.k_document_end = bounds.end;
    ScopedPhase phase(timer, Phase::fa);
    ops::attention_forward(out, lse, q, k, v, p);
    return;
  }

  // K/V travel together: buffer [T_loc, Hk, d + dv], K in the first d columns of each head row.
  const BufferSpec kv = ring_buffers(layout.total_length(), t_local, q.size(1), hk, d, dv, dtype, DType::f32).kv;
  Tensor buffers[2] = {kv.empty(device, {MemoryPart::workspaces, "ring K/V"}),
                       kv.empty(device, {MemoryPart::workspaces, "ring K/V in flight"})};
  {
    ScopedPhase phase(timer, Phase::other);
    copy_into(buffers[0].view().narrow(2, 0, d), k);
    copy_into(buffers[0].view().narrow(2, d, dv), v);
  }

  fill(out, 0.0f);
  fill(lse, -std::numeric_limits<float>::infinity());
  const std::vector<RingStep> steps = ring_steps(topology, world, rank);
  for (size_t step = 0; step < steps.size(); ++step) {
    const RingStep& at = steps[step];
    const TensorView held = buffers[step % 2];
    std::unique_ptr<Transfer> transfer;
    if (step + 1 < steps.size()) {
      // Overlap: the next block is in flight while this one is computed.
      transfer = comm.start_send_recv(held, at.next, buffers[(step + 1) % 2], at.prev);
    }
    for (const Segment& qs : layout.local_segments()) {
      for (const Segment& ks : layout.segments_of(at.source)) {
        std::optional<ops::AttentionParams> pair = pair_params(params, layout, bounds, qs, ks);
        if (!pair) continue;  // wholly in the future, or in other documents
        ops::AttentionParams& p = *pair;
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

namespace hydra {

void ring_attention_backward(Communicator& comm, const SequenceLayout& layout, const TensorView& dq,
                             const TensorView& dk, const TensorView& dv, const TensorView& d_out,
                             const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                             const TensorView& lse, const ops::AttentionParams& params, PhaseTimer* timer,
                             RingTopology topology) {
  const int64_t t_local = layout.local_length();
  expect_shape(q, "ring q", {{"T_loc", t_local}, {"Hq", -1}, {"d", -1}});
  expect_shape(k, "ring k", {{"T_loc", t_local}, {"Hk", -1}, {"d", q.size(2)}});
  expect_shape(v, "ring v", {{"T_loc", t_local}, {"Hk", k.size(1)}, {"dv", q.size(2)}});
  expect_shape(dq, "ring dq", {{"T_loc", t_local}, {"Hq", q.size(1)}, {"d", q.size(2)}});
  expect_shape(dk, "ring dk", {{"T_loc", t_local}, {"Hk", k.size(1)}, {"d", q.size(2)}});
  expect_shape(dv, "ring dv", {{"T_loc", t_local}, {"Hk", k.size(1)}, {"dv", q.size(2)}});
  HYDRA_ASSERT(dk.is_contiguous() && dv.is_contiguous(), "ring dk/dv must be contiguous");
  const int world = comm.size(), rank = comm.rank();
  const int64_t hq = q.size(1), hk = k.size(1), d = k.size(2);
  const Device device = q.device();
  const DType acc = dq.dtype();
  const RingBuffers spec = ring_buffers(layout.total_length(), t_local, hq, hk, d, d, k.dtype(), acc);
  Tensor delta = spec.delta.empty(device, {MemoryPart::workspaces, "attention delta"});
  {
    ScopedPhase phase(timer, Phase::fa);
    ops::attention_backward_prepare(delta, d_out, out);
    fill(dq, 0.0f);
  }
  const PositionBounds bounds = position_bounds(layout, device);
  if (world == 1) {
    ops::AttentionParams p = params;
    p.q_position0 = p.k_position0 = 0;
    p.q_document_start = bounds.start;
    p.k_document_end = bounds.end;
    ScopedPhase phase(timer, Phase::fa);
    fill(dk, 0.0f);
    fill(dv, 0.0f);
    ops::attention_backward(dq, dk, dv, d_out, q, k, v, lse, delta, p);
    return;
  }

  // K/V travel as in the forward ([T_loc, Hk, 2d], K first). Their gradient accumulators travel one
  // step behind in [2, T_loc, Hk, d] buffers (dK, dV): `fresh` takes this rank's contribution to the
  // held keys, `carried[0]` the accumulator received for them, `carried[1]` the next one in flight.
  Tensor kv[2] = {spec.kv.empty(device, {MemoryPart::workspaces, "ring K/V"}),
                  spec.kv.empty(device, {MemoryPart::workspaces, "ring K/V in flight"})};
  Tensor fresh = spec.kv_gradients.empty(device, {MemoryPart::workspaces, "ring dK/dV"});
  Tensor carried[2] = {spec.kv_gradients.zeros(device, {MemoryPart::workspaces, "ring dK/dV carried"}),
                       spec.kv_gradients.empty(device, {MemoryPart::workspaces, "ring dK/dV in flight"})};
  {
    ScopedPhase phase(timer, Phase::other);
    copy_into(kv[0].view().narrow(2, 0, d), k);
    copy_into(kv[0].view().narrow(2, d, d), v);
  }
  const std::vector<RingStep> steps = ring_steps(topology, world, rank);
  std::unique_ptr<Transfer> grad_transfer;
  for (size_t step = 0; step < steps.size(); ++step) {
    const RingStep& at = steps[step];
    const TensorView held = kv[step % 2];
    std::unique_ptr<Transfer> kv_transfer;
    if (step + 1 < steps.size()) kv_transfer = comm.start_send_recv(held, at.next, kv[(step + 1) % 2], at.prev);
    {
      ScopedPhase phase(timer, Phase::fa);
      fill(fresh, 0.0f);
      for (const Segment& qs : layout.local_segments()) {
        for (const Segment& ks : layout.segments_of(at.source)) {
          const std::optional<ops::AttentionParams> pair = pair_params(params, layout, bounds, qs, ks);
          if (!pair) continue;  // wholly in the future, or in other documents
          const ops::AttentionParams& p = *pair;
          const TensorView kvs = held.narrow(0, ks.local_offset, ks.length);
          const auto rows = [&](const TensorView& t) { return t.narrow(0, qs.local_offset, qs.length); };
          ops::attention_backward(rows(dq), fresh.view().select(0, 0).narrow(0, ks.local_offset, ks.length),
                                  fresh.view().select(0, 1).narrow(0, ks.local_offset, ks.length), rows(d_out),
                                  rows(q), kvs.narrow(2, 0, d), kvs.narrow(2, d, d), lse.narrow(1, qs.local_offset, qs.length),
                                  delta.view().narrow(1, qs.local_offset, qs.length), p);
        }
      }
    }
    // The accumulator for the source's keys (posted at the end of the previous step) must be here before
    // this rank's contribution is added and it moves on.
    if (grad_transfer) {
      ScopedPhase phase(timer, Phase::comm);
      grad_transfer->wait();
      std::swap(carried[0], carried[1]);
    }
    {
      ScopedPhase phase(timer, Phase::fa);
      ops::add_inplace(carried[0].view().reshape({2 * t_local, hk * d}), fresh.view().reshape({2 * t_local, hk * d}));
    }
    // Pass it on: after P hops (the last one at step P−1) every accumulator is home.
    grad_transfer = comm.start_send_recv(carried[0], at.next, carried[1], at.prev);
    if (kv_transfer) {
      ScopedPhase phase(timer, Phase::comm);
      kv_transfer->wait();
    }
  }
  ScopedPhase phase(timer, Phase::comm);
  grad_transfer->wait();
  copy_into(dk, carried[1].view().select(0, 0));
  copy_into(dv, carried[1].view().select(0, 1));
}

}  // namespace hydra
