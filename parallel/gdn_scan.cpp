#include "parallel/gdn_scan.h"

#include <optional>

#include "kernels/conv/conv.h"

namespace hydra {

void gdn_sequence_parallel(Communicator& comm, const SequenceLayout& layout, const TensorView& out,
                           const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                           const TensorView& beta, const ops::DeltaRuleParams& params, PhaseTimer* timer) {
  const int64_t t_local = layout.local_length();
  expect_shape(k, "gdn k", {{"T_loc", t_local}, {"H", -1}, {"dk", -1}});
  const int64_t heads = k.size(1), dk = k.size(2), dv = v.size(2);
  const Device device = k.device();
  const std::vector<Segment>& local = layout.local_segments();
  const int nlocal = static_cast<int>(local.size());

  Tensor state = Tensor::empty({heads, dk, dv}, DType::f32, device);
  if (layout.world_size() == 1) {
    ScopedPhase phase(timer, Phase::gdn);
    fill(state, 0.0f);
    ops::delta_rule_chunked(out, state, q, k, v, g, beta, params);
    return;
  }
  // 1. Maps of the owned segments: slot [j] = (M [H, dk, dk], S_ext [H, dk, dv]) flattened.
  const int64_t map_size = heads * (dk * dk + dk * dv);
  Tensor mine = Tensor::zeros({nlocal, map_size}, DType::f32, device);
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
  Tensor all = Tensor::empty({layout.world_size(), nlocal, map_size}, DType::f32, device);
  phase.reset();
  phase.emplace(timer, Phase::comm);
  comm.all_gather(mine, all);
  phase.reset();
  phase.emplace(timer, Phase::gdn);
  auto map_of = [&](int segment) {
    const int owner = layout.owner_of(segment);
    const std::vector<Segment> owned = layout.segments_of(owner);
    const int slot = owned[0].index == segment ? 0 : 1;
    return all.view().select(0, owner).select(0, slot);
  };
  // 3. Fold the prefix for each owned segment, then run its chunks from the true initial state.
  for (const Segment& s : local) {
    fill(state, 0.0f);
    for (int i = 0; i < s.index; ++i) {
      const TensorView m = map_of(i);
      ops::delta_rule_apply_map(state, m.narrow(0, 0, heads * dk * dk).reshape({heads, dk, dk}),
                                m.narrow(0, heads * dk * dk, heads * dk * dv).reshape({heads, dk, dv}));
    }
    ops::delta_rule_chunked(out.narrow(0, s.local_offset, s.length), state, q.narrow(0, s.local_offset, s.length),
                            k.narrow(0, s.local_offset, s.length), v.narrow(0, s.local_offset, s.length),
                            g.narrow(0, s.local_offset, s.length), beta.narrow(0, s.local_offset, s.length), params);
  }
}

void causal_conv_sequence_parallel(Communicator& comm, const SequenceLayout& layout, const TensorView& out,
                                   const TensorView& x, const TensorView& w, PhaseTimer* timer) {
  const int64_t t_local = layout.local_length();
  expect_shape(x, "conv x", {{"T_loc", t_local}, {"C", -1}});
  const int64_t channels = x.size(1), halo = w.size(1) - 1;
  const std::vector<Segment>& local = layout.local_segments();
  if (layout.world_size() == 1 || halo == 0) {
    ScopedPhase phase(timer, Phase::gdn);
    for (const Segment& s : local) {
      ops::causal_conv_silu(out.narrow(0, s.local_offset, s.length), x.narrow(0, s.local_offset, s.length), w,
                            TensorView());
    }
    return;
  }
  HYDRA_USER_CHECK(layout.segment_length() >= halo,
                   "segments of {} tokens are shorter than the conv halo ({} rows); use a longer sequence or "
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
  for (const Segment& s : local) {
    TensorView prefix;
    if (s.index > 0) {
      const int prev = s.index - 1, owner = layout.owner_of(prev);
      const int slot = layout.segments_of(owner)[0].index == prev ? 0 : 1;
      prefix = all.view().select(0, owner).select(0, slot);
    }
    ops::causal_conv_silu(out.narrow(0, s.local_offset, s.length), x.narrow(0, s.local_offset, s.length), w, prefix);
  }
}

}  // namespace hydra
