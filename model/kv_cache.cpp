#include "model/kv_cache.h"

#include <algorithm>
#include <array>

#include "kernels/attention/attention_decode.h"
#include "model/model.h"
#include "runtime/cuda_graph.h"

namespace hydra {
namespace {

// The KV heads a layer caches and its GDN heads, from the config alone.
struct LayerCounts {
  int64_t kv = 0, gdn = 0;
};

LayerCounts layer_counts(const ModelConfig& config, int64_t layer) {
  if (!config.is_hydra()) return {config.num_kv_heads, 0};
  const int64_t fa = static_cast<int64_t>(config.fa_heads_of(layer).size());
  return {fa > 0 ? static_cast<int64_t>(config.fa_kv_heads_of(layer).size()) : 0, config.num_heads - fa};
}

}  // namespace

std::vector<KvCacheLayerSpec> kv_cache_spec(const ModelConfig& config, int64_t slots, int64_t capacity, DType dtype,
                                            DType acc_dtype) {
  const int64_t d = config.head_dim, halo = config.conv_kernel - 1;
  std::vector<KvCacheLayerSpec> spec;
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const LayerCounts c = layer_counts(config, l);
    KvCacheLayerSpec s;
    if (c.kv > 0) s.k = s.v = {{slots, capacity, c.kv, d}, dtype};
    if (c.gdn > 0) {
      s.state = {{slots, c.gdn, d, d}, acc_dtype};
      if (halo > 0) s.conv_tail = {{slots, halo, 3 * c.gdn * d}, dtype};
    }
    spec.push_back(s);
  }
  return spec;
}

KvCacheBytes kv_cache_bytes(const ModelConfig& config, DType dtype, DType acc_dtype) {
  KvCacheBytes b;
  for (const KvCacheLayerSpec& s : kv_cache_spec(config, 1, 1, dtype, acc_dtype)) {  // one slot of one row
    const auto bytes = [](const BufferSpec& x) { return x.exists() ? x.bytes() : 0.0; };
    b.per_token += bytes(s.k) + bytes(s.v);
    b.per_slot += bytes(s.state) + bytes(s.conv_tail);
  }
  return b;
}

KvCache::KvCache(const Model& model, int64_t slots, int64_t capacity, int world_size, int rank)
    : device_(model.device()),
      dtype_(model.dtype()),
      acc_(model.acc_dtype()),
      world_(world_size),
      rank_(rank),
      capacity_(capacity),
      halo_(model.config().conv_kernel - 1),
      tokens_(static_cast<size_t>(slots), 0),
      local_(static_cast<size_t>(slots), 0),
      prefilled_(static_cast<size_t>(slots), 0) {
  const ModelConfig& config = model.config();
  HYDRA_ASSERT(slots >= 1 && capacity >= 1, "a cache of {} slots x {} rows", slots, capacity);
  const auto zeros = [&](const BufferSpec& s) { return s.exists() ? s.zeros(device_) : Tensor(); };
  int64_t most_fa_heads = 0;
  for (const KvCacheLayerSpec& s : kv_cache_spec(config, slots, capacity, dtype_, acc_)) {
    layers_.push_back({zeros(s.k), zeros(s.v), zeros(s.state), zeros(s.conv_tail)});
  }
  for (int64_t l = 0; l < config.num_layers; ++l) {
    if (layers_[static_cast<size_t>(l)].k.defined()) {
      most_fa_heads = std::max(most_fa_heads, config.is_hydra() ? static_cast<int64_t>(config.fa_heads_of(l).size())
                                                                : config.num_heads);
    }
  }
  // The step buffer: positions (i64) first, so every part is aligned.
  step_device_ = Tensor::zeros({5 * slots}, DType::i32, device_);
  step_host_ = Tensor::zeros({5 * slots}, DType::i32);
  if (most_fa_heads > 0) part_ = Tensor::empty({slots * most_fa_heads * (config.head_dim + 1)}, acc_, device_);
  if (world_ > 1 && most_fa_heads > 0) {
    parts_ = Tensor::empty({world_ * part_.numel()}, acc_, device_);
    merged_lse_ = Tensor::empty({most_fa_heads * slots}, acc_, device_);
  }
}

double KvCache::allocated_bytes() const {
  double bytes = 0;
  for (const KvCacheLayer& l : layers_) {
    for (const Tensor* t : {&l.k, &l.v, &l.state, &l.conv_tail}) bytes += t->defined() ? static_cast<double>(t->nbytes()) : 0.0;
  }
  return bytes;
}

void KvCache::set_filled(int64_t slot, int64_t tokens, int64_t rows) {
  HYDRA_ASSERT(rows <= capacity_ && rows <= tokens, "slot {}: {} rows of {} tokens in a cache of {} rows", slot, rows,
               tokens, capacity_);
  tokens_.at(static_cast<size_t>(slot)) = tokens;
  local_.at(static_cast<size_t>(slot)) = rows;
  prefilled_.at(static_cast<size_t>(slot)) = tokens;
}

void KvCache::begin_prefill(int64_t slot, const SequenceLayout& layout) {
  HYDRA_ASSERT(mode_ == Mode::idle && tokens(slot) == 0, "prefill of slot {} (holding {} tokens) while {}", slot,
               tokens(slot), mode_ == Mode::idle ? "idle" : "busy");
  HYDRA_ASSERT(layout.world_size() == world_ && layout.rank() == rank_ && layout.local_length() <= capacity_,
               "prefill layout of {} rows on rank {}/{} for a cache of {} rows on rank {}/{}", layout.local_length(),
               layout.rank(), layout.world_size(), capacity_, rank_, world_);
  mode_ = Mode::prefill;
  prefill_slot_ = slot;
  prefill_layout_ = layout;
}

void KvCache::end_prefill(Communicator& comm) {
  HYDRA_ASSERT(mode_ == Mode::prefill, "end_prefill without a prefill");
  const SequenceLayout& layout = prefill_layout_;
  const int owner = layout.owner_of(layout.num_segments() - 1);
  if (world_ > 1) {  // the GDN state and conv tail of the prompt's end, from the last segment's owner
    for (const KvCacheLayer& l : layers_) {
      if (l.state.defined()) comm.broadcast(l.state.view().select(0, prefill_slot_), owner);
      if (l.conv_tail.defined()) comm.broadcast(l.conv_tail.view().select(0, prefill_slot_), owner);
    }
  }
  const size_t s = static_cast<size_t>(prefill_slot_);
  tokens_[s] = prefilled_[s] = layout.total_length();
  local_[s] = layout.local_length();
  mode_ = Mode::idle;
  prefill_slot_ = -1;
}

void KvCache::store_kv(int64_t layer, const TensorView& k, const TensorView& v) {
  HYDRA_ASSERT(mode_ == Mode::prefill, "store_kv outside a prefill");
  const KvCacheLayer& l = layers_.at(static_cast<size_t>(layer));
  const int64_t rows = prefill_layout_.local_length();
  copy_into(l.k.view().select(0, prefill_slot_).narrow(0, 0, rows), k);
  copy_into(l.v.view().select(0, prefill_slot_).narrow(0, 0, rows), v);
}

TensorView KvCache::final_state(int64_t layer) const {
  HYDRA_ASSERT(mode_ == Mode::prefill, "final_state outside a prefill");
  const SequenceLayout& layout = prefill_layout_;
  if (layout.owner_of(layout.num_segments() - 1) != rank_) return TensorView();
  return layers_.at(static_cast<size_t>(layer)).state.view().select(0, prefill_slot_);
}

void KvCache::store_conv_tail(int64_t layer, const TensorView& x) {
  HYDRA_ASSERT(mode_ == Mode::prefill, "store_conv_tail outside a prefill");
  const KvCacheLayer& l = layers_.at(static_cast<size_t>(layer));
  const SequenceLayout& layout = prefill_layout_;
  const int last = layout.num_segments() - 1;
  if (!l.conv_tail.defined() || layout.owner_of(last) != rank_) return;
  const auto& local = layout.local_segments();
  const Segment& s = *std::find_if(local.begin(), local.end(), [&](const Segment& seg) { return seg.index == last; });
  // The last K−1 inputs of the sequence; a shorter sequence leaves the first rows zero (before token 0).
  const int64_t n = std::min(halo_, s.length);
  const TensorView tail = l.conv_tail.view().select(0, prefill_slot_);  // [K−1, C]
  copy_into(tail.narrow(0, halo_ - n, n), x.narrow(0, s.local_offset + s.length - n, n));
}

void KvCache::begin_decode(std::span<const int64_t> slots) {
  HYDRA_ASSERT(mode_ == Mode::idle && !slots.empty(), "begin_decode of {} rows while busy", slots.size());
  const int64_t rows = static_cast<int64_t>(slots.size()), n = this->slots();
  HYDRA_ASSERT(rows <= n, "a decode step of {} rows in a cache of {} slots", rows, n);
  step_slots_.assign(slots.begin(), slots.end());
  // Host staging, the layout of step_device_: positions i64 [S] | slots | lengths | append i32 [S].
  int64_t* position = static_cast<int64_t*>(step_host_.data());
  int32_t* slot_of = step_host_.data_as<int32_t>() + 2 * n;
  int32_t* length = slot_of + n;
  int32_t* append = length + n;
  step_max_length_ = 0;
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t slot = step_slots_[static_cast<size_t>(b)];
    const size_t s = static_cast<size_t>(slot);
    HYDRA_ASSERT(slot >= 0 && slot < n && std::count(step_slots_.begin(), step_slots_.end(), slot) == 1,
                 "decode rows need distinct slots of {} (slot {})", n, slot);
    const bool here = dealing(slot).owner(tokens_[s]) == rank_;
    HYDRA_ASSERT(!here || local_[s] < capacity_, "slot {}: the cache of {} rows is full", slot, capacity_);
    position[b] = tokens_[s];
    slot_of[b] = static_cast<int32_t>(slot);
    append[b] = here ? static_cast<int32_t>(local_[s]) : -1;
    length[b] = static_cast<int32_t>(local_[s] + (here ? 1 : 0));
    step_max_length_ = std::max<int64_t>(step_max_length_, length[b]);
  }
  if (whole_capacity_) step_max_length_ = capacity_;
  copy_into(step_device_, step_host_);  // one upload, in place
  char* base = static_cast<char*>(step_device_.data());
  const std::array<int64_t, 1> shape{rows};
  // positions() is a Tensor [B] (the layer's argument): inside a decode engine's step it is the step
  // arena's block (the same every step, model/decode_engine.h), filled from the step buffer.
  positions_ = Tensor::empty(shape, DType::i64, device_);
  copy_into(positions_, TensorView(base, DType::i64, device_, shape));
  slots_ = TensorView(base + 8 * n, DType::i32, device_, shape);
  lengths_ = TensorView(base + 12 * n, DType::i32, device_, shape);
  append_ = TensorView(base + 16 * n, DType::i32, device_, shape);
  mode_ = Mode::decode;
}

void KvCache::end_decode() {
  HYDRA_ASSERT(mode_ == Mode::decode, "end_decode without a decode step");
  for (const int64_t slot : step_slots_) {
    const size_t s = static_cast<size_t>(slot);
    if (dealing(slot).owner(tokens_[s]) == rank_) ++local_[s];
    ++tokens_[s];
  }
  mode_ = Mode::idle;
}

void KvCache::attend(Communicator& comm, int64_t layer, const TensorView& out, const TensorView& q, const TensorView& k,
                     const TensorView& v, const ops::AttentionParams& params, PhaseTimer* timer) const {
  HYDRA_ASSERT(mode_ == Mode::decode, "attend outside a decode step");
  const KvCacheLayer& l = layers_.at(static_cast<size_t>(layer));
  const int64_t rows = q.size(0), hq = q.size(1), dv = v.size(2);
  {
    ScopedPhase phase(timer, Phase::fa);
    ops::kv_cache_append(l.k, l.v, k, v, slots_, append_);
  }
  // This rank's partial result packed as [out (B·Hq·dv) | lse (Hq·B)], so one all-gather moves both.
  const int64_t n_out = rows * hq * dv, n = n_out + hq * rows;
  const TensorView mine = part_.view().narrow(0, 0, n);
  const TensorView mine_out = mine.narrow(0, 0, n_out).reshape({rows, hq, dv});
  const TensorView mine_lse = mine.narrow(0, n_out, hq * rows).reshape({hq, rows});
  {
    ScopedPhase phase(timer, Phase::fa);
    ops::attention_decode(world_ == 1 ? out : mine_out, mine_lse, q, l.k, l.v, slots_, lengths_, step_max_length_,
                          positions_, params);
  }
  if (world_ == 1) return;
  const TensorView all = parts_.view().narrow(0, 0, world_ * n);
  {
    // On the host side of a captured step (runtime/cuda_graph.h): the step's graph is cut here, and
    // every launch runs the all-gather between the two segments (part_ and parts_ keep their
    // addresses for the cache's life).
    ScopedPhase phase(timer, Phase::comm);
    CudaGraph::outside([&comm, mine, all] { comm.all_gather(mine, all); });
  }
  // Every rank merges the same gathered parts in rank order, so all ranks get the same bits.
  const std::array<int64_t, 4> out_shape{world_, rows, hq, dv}, out_strides{n, hq * dv, dv, 1};
  const std::array<int64_t, 3> lse_shape{world_, hq, rows}, lse_strides{n, rows, 1};
  const TensorView parts_out(all.data(), acc_, device_, out_shape, out_strides);
  const TensorView parts_lse(static_cast<char*>(all.data()) + n_out * static_cast<int64_t>(dtype_size(acc_)), acc_,
                             device_, lse_shape, lse_strides);
  const TensorView lse = merged_lse_.view().narrow(0, 0, hq * rows).reshape({hq, rows});  // a decode step keeps none
  ScopedPhase phase(timer, Phase::fa);
  ops::attention_merge_partials(out, lse, parts_out, parts_lse);
}

void KvCache::gdn_decode(int64_t layer, ops::GdnDecodeTensors t, const ops::GdnQkParams& qk,
                         const ops::DeltaRuleParams& rule) const {
  HYDRA_ASSERT(mode_ == Mode::decode, "gdn_decode outside a decode step");
  const KvCacheLayer& c = layers_.at(static_cast<size_t>(layer));
  t.state = c.state;
  t.tail = c.conv_tail;
  t.slots = slots_;
  t.positions = positions_;
  ops::gdn_decode_step(t, qk, rule);
}

}  // namespace hydra
