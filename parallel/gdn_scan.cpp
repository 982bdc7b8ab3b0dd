#include "parallel/gdn_scan.h"

#include <optional>

#include "kernels/conv/conv.h"
#include "kernels/elementwise/elementwise.h"

namespace hydra {
namespace {

// The entry of global segment `segment` in a buffer gathered over ranks, [P, n_local, ...]: its
// owner's row, at the owner's local slot of that segment.
TensorView gathered_slot(const SequenceLayout& layout, const Tensor& all, int segment) {
  const int owner = layout.owner_of(segment);
  const int slot = layout.segments_of(owner)[0].index == segment ? 0 : 1;
  return all.view().select(0, owner).select(0, slot);
}

}  // namespace

void gdn_sequence_parallel(Communicator& comm, const SequenceLayout& layout, const TensorView& out,
                           const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                           const TensorView& beta, const ops::DeltaRuleParams& params, PhaseTimer* timer,
                           GdnSaved* saved, const TensorView& final_state) {
  const int64_t t_local = layout.local_length();
  expect_shape(k, "gdn k", {{"T_loc", t_local}, {"H", -1}, {"dk", -1}});
  const int64_t heads = k.size(1), dk = k.size(2), dv = v.size(2);
  const Device device = k.device();
  const std::vector<Segment>& local = layout.local_segments();
  const int nlocal = static_cast<int>(local.size());

  const DType acc = accumulator_dtype(k.dtype(), device);
  Tensor state = Tensor::empty({heads, dk, dv}, acc, device);
  if (layout.world_size() == 1) {
    ScopedPhase phase(timer, Phase::gdn);
    fill(state, 0.0f);
    ops::delta_rule_chunked(out, state, q, k, v, g, beta, params);
    if (final_state.defined()) copy_into(final_state, state);
    return;
  }
  // 1. Maps of the owned segments: slot [j] = (M [H, dk, dk], S_ext [H, dk, dv]) flattened.
  const int64_t map_size = heads * (dk * dk + dk * dv);
  Tensor mine = Tensor::zeros({nlocal, map_size}, acc, device);
  const int last_segment = layout.num_segments() - 1;
  std::optional<ScopedPhase> phase(std::in_place, timer, Phase::gdn);
  for (int j = 0; j < nlocal; ++j) {
    const Segment& s = local[j];
    if (s.index == last_segment) continue;  // nobody folds past the last segment
    const TensorView slot = mine.view().select(0, j);
    ops::delta_rule_segment_map(slot.narrow(0, 0, heads * dk * dk).reshape({heads, dk, dk}),
                                slot.narrow(0, heads * dk * dk, heads * dk * dv).reshape({heads, dk, dv}),
                                k.narrow(0, s.local_offset, s.length), v.narrow(0, s.local_offset, s.length),
                                g.narrow(0, s.local_offset, s.length), beta.narrow(0, s.local_offset, s.length),
                                params);
  }
  // 2. One collective: every rank gets every segment's map.
  Tensor all = Tensor::empty({layout.world_size(), nlocal, map_size}, acc, device);
  phase.reset();
  phase.emplace(timer, Phase::comm);
  comm.all_gather(mine, all);
  phase.reset();
  phase.emplace(timer, Phase::gdn);
  auto map_of = [&](int segment) { return gathered_slot(layout, all, segment); };
  if (saved) {
    saved->maps = all;
    saved->state0 = Tensor::empty({nlocal, heads, dk, dv}, acc, device);
  }
  // 3. Fold the prefix for each owned segment, then run its chunks from the true initial state.
  for (int j = 0; j < nlocal; ++j) {
    const Segment& s = local[j];
    fill(state, 0.0f);
    for (int i = 0; i < s.index; ++i) {
      const TensorView m = map_of(i);
      ops::delta_rule_apply_map(state, m.narrow(0, 0, heads * dk * dk).reshape({heads, dk, dk}),
                                m.narrow(0, heads * dk * dk, heads * dk * dv).reshape({heads, dk, dv}));
    }
    if (saved) copy_into(saved->state0.view().select(0, j), state);
    ops::delta_rule_chunked(out.narrow(0, s.local_offset, s.length), state, q.narrow(0, s.local_offset, s.length),
                            k.narrow(0, s.local_offset, s.length), v.narrow(0, s.local_offset, s.length),
                            g.narrow(0, s.local_offset, s.length), beta.narrow(0, s.local_offset, s.length), params);
    if (final_state.defined() && s.index == last_segment) copy_into(final_state, state);
  }
}

void causal_conv_sequence_parallel(Communicator& comm, const SequenceLayout& layout, const TensorView& out,
                                   const TensorView& x, const TensorView& w, PhaseTimer* timer,
                                   const GdnQkFinish* finish) {
  const int64_t t_local = layout.local_length();
  expect_shape(x, "conv x", {{"T_loc", t_local}, {"C", -1}});
  const int64_t channels = x.size(1), halo = w.size(1) - 1;
  const std::vector<Segment>& local = layout.local_segments();
  const auto conv = [&](const Segment& s, const TensorView& prefix) {
    const auto rows = [&](const TensorView& v) { return v.narrow(0, s.local_offset, s.length); };
    if (finish) {
      ops::gdn_qkv_conv(rows(out), rows(finish->inv_norm), rows(x), w, prefix, rows(finish->positions), finish->params);
    } else {
      ops::causal_conv_silu(rows(out), rows(x), w, prefix);
    }
  };
  if (layout.world_size() == 1 || halo == 0) {
    ScopedPhase phase(timer, Phase::gdn);
    for (const Segment& s : local) conv(s, TensorView());
    return;
  }
  HYDRA_USER_CHECK(layout.segment_length() >= halo,
                   "segments of {} token(s) are shorter than the conv halo ({} rows); use a longer sequence or "
                   "fewer ranks", layout.segment_length(), halo);
  const int nlocal = static_cast<int>(local.size());
  Tensor mine = Tensor::empty({nlocal, halo, channels}, x.dtype(), x.device());
  std::optional<ScopedPhase> phase(std::in_place, timer, Phase::gdn);
  for (int j = 0; j < nlocal; ++j) {
    const Segment& s = local[j];
    copy_into(mine.view().select(0, j), x.narrow(0, s.local_offset + s.length - halo, halo));
  }
  Tensor all = Tensor::empty({layout.world_size(), nlocal, halo, channels}, x.dtype(), x.device());
  phase.reset();
  phase.emplace(timer, Phase::comm);
  comm.all_gather(mine, all);
  phase.reset();
  phase.emplace(timer, Phase::gdn);
  for (const Segment& s : local) conv(s, s.index > 0 ? gathered_slot(layout, all, s.index - 1) : TensorView());
}

void gdn_sequence_parallel_recompute(const SequenceLayout& layout, const GdnSaved& saved, const TensorView& out,
                                     const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& g, const TensorView& beta, const ops::DeltaRuleParams& params,
                                     PhaseTimer* timer) {
  ScopedPhase phase(timer, Phase::gdn);
  const int64_t heads = k.size(1), dkh = k.size(2), dvh = v.size(2);
  const Device device = k.device();
  const DType acc = accumulator_dtype(k.dtype(), device);
  HYDRA_ASSERT(layout.world_size() == 1 || saved.state0.defined(), "GDN recompute over {} ranks without kept states",
               layout.world_size());
  Tensor state = Tensor::empty({heads, dkh, dvh}, acc, device);
  const std::vector<Segment>& local = layout.local_segments();
  for (size_t j = 0; j < local.size(); ++j) {
    const Segment& s = local[j];
    if (layout.world_size() == 1) {
      fill(state, 0.0f);
    } else {
      copy_into(state, saved.state0.view().select(0, static_cast<int64_t>(j)));
    }
    const auto rows = [&](const TensorView& t) { return t.narrow(0, s.local_offset, s.length); };
    ops::delta_rule_chunked(rows(out), state, rows(q), rows(k), rows(v), rows(g), rows(beta), params);
  }
}

void gdn_sequence_parallel_backward(Communicator& comm, const SequenceLayout& layout, const GdnSaved& saved,
                                    const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                    const TensorView& dg, const TensorView& dbeta, const TensorView& d_out,
                                    const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& g, const TensorView& beta, const ops::DeltaRuleParams& params,
                                    PhaseTimer* timer) {
  const int64_t t_local = layout.local_length();
  expect_shape(k, "gdn k", {{"T_loc", t_local}, {"H", -1}, {"dk", -1}});
  const int64_t heads = k.size(1), dkh = k.size(2), dvh = v.size(2);
  const Device device = k.device();
  const DType acc = accumulator_dtype(k.dtype(), device);
  const std::vector<Segment>& local = layout.local_segments();
  const int nlocal = static_cast<int>(local.size());
  const auto rows = [](const TensorView& t, const Segment& s) { return t.narrow(0, s.local_offset, s.length); };
  Tensor d_state = Tensor::empty({heads, dkh, dvh}, acc, device);
  if (layout.world_size() == 1) {
    ScopedPhase phase(timer, Phase::gdn);
    Tensor state0 = Tensor::zeros({heads, dkh, dvh}, acc, device);
    fill(d_state, 0.0f);
    ops::delta_rule_chunked_backward(dq, dk, dv, dg, dbeta, d_state, d_out, q, k, v, g, beta, state0, params);
    return;
  }
  HYDRA_ASSERT(saved.state0.defined() && saved.maps.defined(), "GDN backward over {} ranks without the forward's maps",
               layout.world_size());
  // 1. Each owned segment's own state gradient dS_loc (nothing arriving from later segments).
  const int64_t state_size = heads * dkh * dvh;
  Tensor mine = Tensor::empty({nlocal, state_size}, acc, device);
  std::optional<ScopedPhase> phase(std::in_place, timer, Phase::gdn);
  for (int j = 0; j < nlocal; ++j) {
    const Segment& s = local[j];
    const TensorView loc = mine.view().select(0, j).reshape({heads, dkh, dvh});
    fill(loc, 0.0f);
    ops::delta_rule_state_backward(loc, rows(d_out, s), rows(q, s), rows(k, s), rows(g, s), rows(beta, s), params);
  }
  // 2. One collective: every rank gets every segment's dS_loc.
  Tensor all = Tensor::empty({layout.world_size(), nlocal, state_size}, acc, device);
  phase.reset();
  phase.emplace(timer, Phase::comm);
  comm.all_gather(mine, all);
  phase.reset();
  phase.emplace(timer, Phase::gdn);
  // 3. Fold the suffix for each owned segment (reverse order, transposed maps), then its backward.
  const int last = layout.num_segments() - 1;
  const int64_t m_size = heads * dkh * dkh;
  for (int j = 0; j < nlocal; ++j) {
    const Segment& s = local[j];
    fill(d_state, 0.0f);
    for (int i = last; i > s.index; --i) {  // d_state = dS_in(i) = M_iᵀ dS_in(i+1) + dS_loc(i)
      const TensorView loc = gathered_slot(layout, all, i).reshape({heads, dkh, dvh});
      if (i == last) {
        copy_into(d_state, loc);  // the last segment's map is never needed (nor computed)
        continue;
      }
      const TensorView m = gathered_slot(layout, saved.maps, i).narrow(0, 0, m_size).reshape({heads, dkh, dkh});
      ops::delta_rule_apply_map_transposed(d_state, m, loc);
    }
    ops::delta_rule_chunked_backward(rows(dq, s), rows(dk, s), rows(dv, s), rows(dg, s), rows(dbeta, s), d_state,
                                     rows(d_out, s), rows(q, s), rows(k, s), rows(v, s), rows(g, s), rows(beta, s),
                                     saved.state0.view().select(0, j), params);
  }
}

void causal_conv_sequence_parallel_backward(Communicator& comm, const SequenceLayout& layout, const TensorView& dx,
                                            const TensorView& dw, const TensorView& d_out, const TensorView& x,
                                            const TensorView& w, PhaseTimer* timer) {
  const int64_t t_local = layout.local_length();
  expect_shape(x, "conv x", {{"T_loc", t_local}, {"C", -1}});
  const int64_t channels = x.size(1), halo = w.size(1) - 1;
  const std::vector<Segment>& local = layout.local_segments();
  const auto rows = [](const TensorView& t, const Segment& s) { return t.narrow(0, s.local_offset, s.length); };
  if (layout.world_size() == 1 || halo == 0) {
    ScopedPhase phase(timer, Phase::gdn);
    for (const Segment& s : local) {
      ops::causal_conv_silu_backward(rows(dx, s), dw, TensorView(), rows(d_out, s), rows(x, s), w, TensorView());
    }
    return;
  }
  const int nlocal = static_cast<int>(local.size());
  // The forward's halos again (each segment's last K−1 input rows), gathered.
  Tensor mine = Tensor::empty({nlocal, halo, channels}, x.dtype(), x.device());
  std::optional<ScopedPhase> phase(std::in_place, timer, Phase::gdn);
  for (int j = 0; j < nlocal; ++j) {
    const Segment& s = local[j];
    copy_into(mine.view().select(0, j), x.narrow(0, s.local_offset + s.length - halo, halo));
  }
  Tensor all = Tensor::empty({layout.world_size(), nlocal, halo, channels}, x.dtype(), x.device());
  phase.reset();
  phase.emplace(timer, Phase::comm);
  comm.all_gather(mine, all);
  phase.reset();
  phase.emplace(timer, Phase::gdn);
  // Each segment's backward, with the gradient of the halo rows it read kept for their owner.
  Tensor d_halo = Tensor::zeros({nlocal, halo, channels}, dx.dtype(), dx.device());
  for (int j = 0; j < nlocal; ++j) {
    const Segment& s = local[j];
    const TensorView prefix = s.index > 0 ? gathered_slot(layout, all, s.index - 1) : TensorView();
    ops::causal_conv_silu_backward(rows(dx, s), dw, s.index > 0 ? d_halo.view().select(0, j) : TensorView(),
                                   rows(d_out, s), rows(x, s), w, prefix);
  }
  Tensor d_all = Tensor::empty({layout.world_size(), nlocal, halo, channels}, dx.dtype(), dx.device());
  phase.reset();
  phase.emplace(timer, Phase::comm);
  comm.all_gather(d_halo, d_all);
  phase.reset();
  phase.emplace(timer, Phase::gdn);
  // Segment i's last K−1 rows receive what segment i+1 read of them.
  for (const Segment& s : local) {
    if (s.index == layout.num_segments() - 1) continue;
    ops::add_inplace(dx.narrow(0, s.local_offset + s.length - halo, halo), gathered_slot(layout, d_all, s.index + 1));
  }
}

}  // namespace hydra
