#include "parallel/gdn_scan.h"

#include <algorithm>
#include <optional>

#include "kernels/conv/conv.h"
#include "kernels/elementwise/elementwise.h"

namespace hydra {
GdnScanBuffers gdn_scan_buffers(int world, int nlocal, int64_t heads, int64_t dk, int64_t dv, DType acc) {
  const int64_t map_size = heads * (dk * dk + dk * dv), m_size = heads * dk * dk, state_size = heads * dk * dv;
  return {.state = {{heads, dk, dv}, acc},
          .maps = {{nlocal, map_size}, acc},
          .gathered_maps = {{world, nlocal, map_size}, acc},
          .kept_maps = {{nlocal, m_size}, acc},
          .initial_states = {{nlocal, heads, dk, dv}, acc},
          .state_gradients = {{nlocal, state_size + m_size}, acc},
          .gathered_state_gradients = {{world, nlocal, state_size + m_size}, acc}};
}

ConvHaloBuffers conv_halo_buffers(int world, int nlocal, int64_t halo, int64_t channels, DType dtype) {
  return {.halos = {{nlocal, halo, channels}, dtype},
          .gathered = {{world, nlocal, halo, channels}, dtype},
          .masked = {{halo, channels}, dtype}};
}

namespace {

// The entry of global segment `segment` in a buffer gathered over ranks, [P, n_local, ...]: its
// owner's row, at the owner's local slot of that segment.
TensorView gathered_slot(const SequenceLayout& layout, const Tensor& all, int segment) {
  const int owner = layout.owner_of(segment);
  const int slot = layout.segments_of(owner)[0].index == segment ? 0 : 1;
  return all.view().select(0, owner).select(0, slot);
}

// A segment cut at the document starts inside it (DESIGN.md §3.6): runs of local rows, each either
// continuing what came before it (only a segment's first run can) or starting a document, whose
// GDN state and conv history then start from zero. Without documents: one run, fresh only at
// position 0 (where the state is zero anyway).
struct Run {
  int64_t offset = 0, length = 0;  // local rows
  bool fresh = false;              // starts a document
};

std::vector<Run> runs_of(const SequenceLayout& layout, const Segment& s) {
  std::vector<Run> runs;
  int64_t begin = s.start;
  for (int64_t cut : layout.starts_inside(s.start, s.start + s.length)) {
    runs.push_back(Run{s.local_offset + begin - s.start, cut - begin, layout.document_start(begin) == begin});
    begin = cut;
  }
  runs.push_back(Run{s.local_offset + begin - s.start, s.start + s.length - begin, layout.document_start(begin) == begin});
  return runs;
}

bool resets_inside(const std::vector<Run>& runs) {
  return std::any_of(runs.begin(), runs.end(), [](const Run& r) { return r.fresh; });
}

TensorView rows_of(const TensorView& t, const Run& r) { return t.narrow(0, r.offset, r.length); }

// The chunked rule over a segment's runs from `state` (the segment's initial state; overwritten
// with its final state): a run that starts a document starts from zero.
void chunked_over_runs(const std::vector<Run>& runs, const TensorView& out, const TensorView& state, const TensorView& q,
                       const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
                       const ops::DeltaRuleParams& params) {
  for (const Run& r : runs) {
    if (r.fresh) fill(state, 0.0f);
    ops::delta_rule_chunked(rows_of(out, r), state, rows_of(q, r), rows_of(k, r), rows_of(v, r), rows_of(g, r),
                            rows_of(beta, r), params);
  }
}

// The halo rows a segment's first run reads (its predecessor's last K−1 input rows, `halo`), with the
// rows that lie before the first run's document start zeroed: a document that starts fewer than K−1
// tokens before the segment sees zeros there, as if it ran alone. Undefined when the first run is
// fresh (no history at all) or there is no predecessor.
Tensor masked_halo(const SequenceLayout& layout, const Segment& s, const TensorView& halo) {
  if (!halo.defined() || layout.document_start(s.start) == s.start) return Tensor();
  Tensor out = clone(halo, {MemoryPart::gdn_maps, "masked halo"});
  const int64_t rows = halo.size(0), first_visible = layout.document_start(s.start) - (s.start - rows);
  if (first_visible > 0) fill(out.view().narrow(0, 0, std::min(first_visible, rows)), 0.0f);
  return out;
}

// Every owned segment's last `halo` input rows of x [T_loc, C] (`mine`, [n_local, K−1, C]) and every
// rank's, gathered (`all`, [P, n_local, K−1, C]): what each segment's conv reads before its first row,
// in the forward and again in the backward. One collective.
struct GatheredHalos {
  Tensor mine, all;
};

GatheredHalos gather_halos(Communicator& comm, const SequenceLayout& layout, const TensorView& x, int64_t halo,
                           PhaseTimer* timer) {
  const std::vector<Segment>& local = layout.local_segments();
  const int nlocal = static_cast<int>(local.size());
  const ConvHaloBuffers spec = conv_halo_buffers(layout.world_size(), nlocal, halo, x.size(1), x.dtype());
  GatheredHalos out{spec.halos.empty(x.device(), {MemoryPart::gdn_maps, "conv halo"}), Tensor()};
  {
    ScopedPhase phase(timer, Phase::gdn);
    for (int j = 0; j < nlocal; ++j) {
      const Segment& s = local[j];
      copy_into(out.mine.view().select(0, j), x.narrow(0, s.local_offset + s.length - halo, halo));
    }
  }
  out.all = spec.gathered.empty(x.device(), {MemoryPart::gdn_maps, "conv halos"});
  ScopedPhase phase(timer, Phase::comm);
  comm.all_gather(out.mine, out.all);
  return out;
}

// Backward over a segment's runs (the reverse of chunked_over_runs): d_state in: the gradient w.r.t.
// the segment's final state; out: w.r.t. its initial state `state0` (zero when its first run starts
// a document, which its initial state then does not reach). A run that starts a document starts
// from zero and passes no gradient to the run before it.
void chunked_backward_over_runs(const std::vector<Run>& runs, const TensorView& dq, const TensorView& dk,
                                const TensorView& dv, const TensorView& dg, const TensorView& dbeta,
                                const TensorView& d_state, const TensorView& d_out, const TensorView& q,
                                const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
                                const TensorView& state0, const ops::DeltaRuleParams& params) {
  const Tensor zero = Tensor::zeros(state0.shape(), state0.dtype(), state0.device(), {MemoryPart::gdn_maps, "GDN zero state"});
  for (size_t i = runs.size(); i-- > 0;) {
    const Run& r = runs[i];
    const TensorView init = i == 0 && !r.fresh ? state0 : zero.view();
    ops::delta_rule_chunked_backward(rows_of(dq, r), rows_of(dk, r), rows_of(dv, r), rows_of(dg, r), rows_of(dbeta, r),
                                     d_state, rows_of(d_out, r), rows_of(q, r), rows_of(k, r), rows_of(v, r),
                                     rows_of(g, r), rows_of(beta, r), init, params);
    if (r.fresh) fill(d_state, 0.0f);
  }
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
  const GdnScanBuffers spec = gdn_scan_buffers(layout.world_size(), nlocal, heads, dk, dv, acc);
  Tensor state = spec.state.empty(device, {MemoryPart::gdn_maps, "GDN state"});
  if (layout.world_size() == 1) {
    ScopedPhase phase(timer, Phase::gdn);
    fill(state, 0.0f);
    chunked_over_runs(runs_of(layout, local[0]), out, state, q, k, v, g, beta, params);
    if (final_state.defined()) copy_into(final_state, state);
    return;
  }
  // 1. Maps of the owned segments: slot [j] = (M [H, dk, dk], S_ext [H, dk, dv]) flattened.
  Tensor mine = spec.maps.zeros(device, {MemoryPart::gdn_maps, "GDN segment maps"});
  const int last_segment = layout.num_segments() - 1;
  std::optional<ScopedPhase> phase(std::in_place, timer, Phase::gdn);
  for (int j = 0; j < nlocal; ++j) {
    const Segment& s = local[j];
    if (s.index == last_segment) continue;  // nobody folds past the last segment
    const TensorView slot = mine.view().select(0, j);
    const TensorView m = slot.narrow(0, 0, heads * dk * dk).reshape({heads, dk, dk});
    const TensorView s_ext = slot.narrow(0, heads * dk * dk, heads * dk * dv).reshape({heads, dk, dv});
    const std::vector<Run> runs = runs_of(layout, s);
    if (resets_inside(runs)) {
      // A document starts in this segment: nothing before it reaches the segment's end, so M = 0
      // and S_ext is the last run's final state from zero (mine is zero-filled: M stays 0).
      const Run& r = runs.back();
      Tensor scratch = Tensor::empty({r.length, heads, dv}, out.dtype(), device, {MemoryPart::workspaces, "GDN reset scratch"});
      fill(s_ext, 0.0f);
      ops::delta_rule_chunked(scratch, s_ext, rows_of(q, r), rows_of(k, r), rows_of(v, r), rows_of(g, r),
                              rows_of(beta, r), params);
      continue;
    }
    ops::delta_rule_segment_map(m, s_ext, k.narrow(0, s.local_offset, s.length), v.narrow(0, s.local_offset, s.length),
                                g.narrow(0, s.local_offset, s.length), beta.narrow(0, s.local_offset, s.length),
                                params);
  }
  // 2. One collective: every rank gets every segment's map.
  Tensor all = spec.gathered_maps.empty(device, {MemoryPart::gdn_maps, "GDN gathered maps"});
  phase.reset();
  phase.emplace(timer, Phase::comm);
  comm.all_gather(mine, all);
  phase.reset();
  phase.emplace(timer, Phase::gdn);
  auto map_of = [&](int segment) { return gathered_slot(layout, all, segment); };
  if (saved) {
    // The backward needs the initial states and the M of later segments: each rank keeps its own
    // segments' M only (S_ext is not needed), and the backward gathers them again.
    saved->maps = spec.kept_maps.empty(device, {MemoryPart::gdn_maps, "GDN kept maps"});
    copy_into(saved->maps, mine.view().narrow(1, 0, heads * dk * dk));
    saved->state0 = spec.initial_states.empty(device, {MemoryPart::gdn_maps, "GDN initial states"});
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
    chunked_over_runs(runs_of(layout, s), out, state, q, k, v, g, beta, params);
    if (final_state.defined() && s.index == last_segment) copy_into(final_state, state);
  }
}

void causal_conv_sequence_parallel(Communicator& comm, const SequenceLayout& layout, const TensorView& out,
                                   const TensorView& x, const TensorView& w, PhaseTimer* timer,
                                   const GdnQkFinish* finish) {
  const int64_t t_local = layout.local_length();
  expect_shape(x, "conv x", {{"T_loc", t_local}, {"C", -1}});
  const int64_t halo = w.size(1) - 1;
  const std::vector<Segment>& local = layout.local_segments();
  // A segment's conv, run by run: the first run reads the halo (rows of another document zeroed), a
  // run that starts a document reads zeros.
  const auto conv = [&](const Segment& s, const TensorView& halo) {
    const Tensor first_prefix = masked_halo(layout, s, halo);
    const std::vector<Run> runs = runs_of(layout, s);
    for (size_t i = 0; i < runs.size(); ++i) {
      const Run& r = runs[i];
      const TensorView prefix = i == 0 ? first_prefix.view() : TensorView();
      const auto rows = [&](const TensorView& v) { return rows_of(v, r); };
      if (finish) {
        ops::gdn_qkv_conv(rows(out), rows(finish->inv_norm), rows(x), w, prefix, rows(finish->positions), finish->params);
      } else {
        ops::causal_conv_silu(rows(out), rows(x), w, prefix);
      }
    }
  };
  if (layout.world_size() == 1 || halo == 0) {
    ScopedPhase phase(timer, Phase::gdn);
    for (const Segment& s : local) conv(s, TensorView());
    return;
  }
  HYDRA_USER_CHECK(conv_halo_fits(layout.segment_length(), halo, layout.world_size()),
                   "segments of {} token(s) are shorter than the conv halo ({} rows); use a longer sequence or "
                   "fewer ranks", layout.segment_length(), halo);
  const GatheredHalos halos = gather_halos(comm, layout, x, halo, timer);
  ScopedPhase phase(timer, Phase::gdn);
  for (const Segment& s : local) conv(s, s.index > 0 ? gathered_slot(layout, halos.all, s.index - 1) : TensorView());
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
  Tensor state = Tensor::empty({heads, dkh, dvh}, acc, device, {MemoryPart::gdn_maps, "GDN state"});
  const std::vector<Segment>& local = layout.local_segments();
  for (size_t j = 0; j < local.size(); ++j) {
    const Segment& s = local[j];
    if (layout.world_size() == 1) {
      fill(state, 0.0f);
    } else {
      copy_into(state, saved.state0.view().select(0, static_cast<int64_t>(j)));
    }
    chunked_over_runs(runs_of(layout, s), out, state, q, k, v, g, beta, params);
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
  const GdnScanBuffers spec = gdn_scan_buffers(layout.world_size(), nlocal, heads, dkh, dvh, acc);
  Tensor d_state = spec.state.empty(device, {MemoryPart::gdn_maps, "GDN state gradient"});
  if (layout.world_size() == 1) {
    ScopedPhase phase(timer, Phase::gdn);
    Tensor state0 = spec.state.zeros(device, {MemoryPart::gdn_maps, "GDN initial state"});
    fill(d_state, 0.0f);
    chunked_backward_over_runs(runs_of(layout, local[0]), dq, dk, dv, dg, dbeta, d_state, d_out, q, k, v, g, beta,
                               state0, params);
    return;
  }
  HYDRA_ASSERT(saved.state0.defined() && saved.maps.defined(), "GDN backward over {} ranks without the forward's maps",
               layout.world_size());
  // 1. Each owned segment's own state gradient dS_loc (nothing arriving from later segments), with
  //    the segment's M beside it: slot [j] = (dS_loc [H, dk, dv], M [H, dk, dk]).
  const int64_t state_size = heads * dkh * dvh, m_size = heads * dkh * dkh;
  Tensor mine = spec.state_gradients.empty(device, {MemoryPart::gdn_maps, "GDN local state gradients and maps"});
  copy_into(mine.view().narrow(1, state_size, m_size), saved.maps);
  std::optional<ScopedPhase> phase(std::in_place, timer, Phase::gdn);
  for (int j = 0; j < nlocal; ++j) {
    const Segment& s = local[j];
    const TensorView loc = mine.view().select(0, j).narrow(0, 0, state_size).reshape({heads, dkh, dvh});
    fill(loc, 0.0f);
    // Only the run before the segment's first document start reads its initial state.
    const Run first = runs_of(layout, s).front();
    if (!first.fresh) {
      ops::delta_rule_state_backward(loc, rows_of(d_out, first), rows_of(q, first), rows_of(k, first),
                                     rows_of(g, first), rows_of(beta, first), params);
    }
  }
  // 2. One collective: every rank gets every segment's dS_loc and M.
  Tensor all = spec.gathered_state_gradients.empty(device, {MemoryPart::gdn_maps, "GDN gathered state gradients and maps"});
  phase.reset();
  phase.emplace(timer, Phase::comm);
  comm.all_gather(mine, all);
  phase.reset();
  phase.emplace(timer, Phase::gdn);
  // 3. Fold the suffix for each owned segment (reverse order, transposed maps), then its backward.
  const int last = layout.num_segments() - 1;
  for (int j = 0; j < nlocal; ++j) {
    const Segment& s = local[j];
    fill(d_state, 0.0f);
    for (int i = last; i > s.index; --i) {  // d_state = dS_in(i) = M_iᵀ dS_in(i+1) + dS_loc(i)
      const TensorView slot = gathered_slot(layout, all, i);
      const TensorView loc = slot.narrow(0, 0, state_size).reshape({heads, dkh, dvh});
      if (i == last) {
        copy_into(d_state, loc);  // the last segment's map is never needed (nor computed)
        continue;
      }
      const TensorView m = slot.narrow(0, state_size, m_size).reshape({heads, dkh, dkh});
      ops::delta_rule_apply_map_transposed(d_state, m, loc);
    }
    chunked_backward_over_runs(runs_of(layout, s), dq, dk, dv, dg, dbeta, d_state, d_out, q, k, v, g, beta,
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
  // A segment's conv backward run by run, as the forward ran it; d_prefix receives the gradient of
  // the halo rows the first run read (rows of another document read zeros: no gradient).
  const auto conv_backward = [&](const Segment& s, const TensorView& halo, const TensorView& d_prefix) {
    const Tensor first_prefix = masked_halo(layout, s, halo);
    const std::vector<Run> runs = runs_of(layout, s);
    for (size_t i = 0; i < runs.size(); ++i) {
      const Run& r = runs[i];
      const bool reads_halo = i == 0 && first_prefix.defined();
      ops::causal_conv_silu_backward(rows_of(dx, r), dw, reads_halo ? d_prefix : TensorView(), rows_of(d_out, r),
                                     rows_of(x, r), w, reads_halo ? first_prefix.view() : TensorView());
    }
    if (first_prefix.defined() && d_prefix.defined()) {  // the zeroed rows were constants
      const int64_t hidden = layout.document_start(s.start) - (s.start - halo.size(0));
      if (hidden > 0) fill(d_prefix.narrow(0, 0, std::min(hidden, halo.size(0))), 0.0f);
    }
  };
  if (layout.world_size() == 1 || halo == 0) {
    ScopedPhase phase(timer, Phase::gdn);
    for (const Segment& s : local) conv_backward(s, TensorView(), TensorView());
    return;
  }
  const int nlocal = static_cast<int>(local.size());
  // The forward's halos again (each segment's last K−1 input rows), gathered.
  const GatheredHalos halos = gather_halos(comm, layout, x, halo, timer);
  std::optional<ScopedPhase> phase(std::in_place, timer, Phase::gdn);
  // Each segment's backward, with the gradient of the halo rows it read kept for their owner.
  const ConvHaloBuffers spec = conv_halo_buffers(layout.world_size(), nlocal, halo, channels, x.dtype());
  Tensor d_halo = spec.halos.zeros(dx.device(), {MemoryPart::gdn_maps, "conv halo gradient"});
  for (int j = 0; j < nlocal; ++j) {
    const Segment& s = local[j];
    const TensorView prefix = s.index > 0 ? gathered_slot(layout, halos.all, s.index - 1) : TensorView();
    conv_backward(s, prefix, s.index > 0 ? d_halo.view().select(0, j) : TensorView());
  }
  Tensor d_all = spec.gathered.empty(dx.device(), {MemoryPart::gdn_maps, "conv halo gradients"});
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
