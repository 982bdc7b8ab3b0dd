#include "model/kv_cache.h"

#include <algorithm>
#include <array>

#include "kernels/attention/attention_decode.h"
#include "kernels/delta_rule/delta_rule_step.h"
#include "kernels/gdn_qk/gdn_qk_step.h"
#include "model/model.h"

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

Tensor device_vector(const std::vector<int64_t>& values, DType dtype, Device device) {
  const int64_t n = static_cast<int64_t>(values.size());
  Tensor host = Tensor::empty({n}, dtype);
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == DType::i32) {
      host.data_as<int32_t>()[i] = static_cast<int32_t>(values[static_cast<size_t>(i)]);
    } else {
      host.data_as<int64_t>()[i] = values[static_cast<size_t>(i)];
    }
  }
  return to_device(host, device);
}

}  // namespace

KvCacheBytes kv_cache_bytes(const ModelConfig& config, DType dtype, DType acc_dtype) {
  KvCacheBytes b;
  const double d = static_cast<double>(config.head_dim), es = static_cast<double>(dtype_size(dtype));
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const LayerCounts c = layer_counts(config, l);
    b.per_token += 2.0 * static_cast<double>(c.kv) * d * es;
    b.per_slot += static_cast<double>(c.gdn) * d * d * static_cast<double>(dtype_size(acc_dtype)) +
                  static_cast<double>(config.conv_kernel - 1) * 3.0 * static_cast<double>(c.gdn) * d * es;
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
  const int64_t d = config.head_dim;
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const LayerCounts c = layer_counts(config, l);
    KvCacheLayer layer;
    if (c.kv > 0) {
      layer.k = Tensor::zeros({slots, capacity, c.kv, d}, dtype_, device_);
      layer.v = Tensor::zeros({slots, capacity, c.kv, d}, dtype_, device_);
    }
    if (c.gdn > 0) {
      layer.state = Tensor::zeros({slots, c.gdn, d, d}, acc_, device_);
      if (halo_ > 0) layer.conv_tail = Tensor::zeros({slots, halo_, 3 * c.gdn * d}, dtype_, device_);
    }
    layers_.push_back(std::move(layer));
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

int KvCache::owner_of_token(int64_t slot, int64_t position) const {
  return static_cast<int>((position - prefilled_[static_cast<size_t>(slot)]) % world_);
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
  step_slots_.assign(slots.begin(), slots.end());
  std::vector<int64_t> position, length, append;
  for (const int64_t slot : step_slots_) {
    const size_t s = static_cast<size_t>(slot);
    HYDRA_ASSERT(slot >= 0 && slot < this->slots() &&
                     std::count(step_slots_.begin(), step_slots_.end(), slot) == 1,
                 "decode rows need distinct slots of {} (slot {})", this->slots(), slot);
    const bool here = owner_of_token(slot, tokens_[s]) == rank_;
    HYDRA_ASSERT(!here || local_[s] < capacity_, "slot {}: the cache of {} rows is full", slot, capacity_);
    position.push_back(tokens_[s]);
    append.push_back(here ? local_[s] : -1);
    length.push_back(local_[s] + (here ? 1 : 0));
  }
  step_max_length_ = *std::max_element(length.begin(), length.end());
  slots_ = device_vector(step_slots_, DType::i32, device_);
  positions_ = device_vector(position, DType::i64, device_);
  lengths_ = device_vector(length, DType::i32, device_);
  append_ = device_vector(append, DType::i32, device_);
  mode_ = Mode::decode;
}

void KvCache::end_decode() {
  HYDRA_ASSERT(mode_ == Mode::decode, "end_decode without a decode step");
  for (const int64_t slot : step_slots_) {
    const size_t s = static_cast<size_t>(slot);
    if (owner_of_token(slot, tokens_[s]) == rank_) ++local_[s];
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
  Tensor mine = Tensor::empty({n}, acc_, device_);
  const TensorView mine_out = mine.view().narrow(0, 0, n_out).reshape({rows, hq, dv});
  const TensorView mine_lse = mine.view().narrow(0, n_out, hq * rows).reshape({hq, rows});
  {
    ScopedPhase phase(timer, Phase::fa);
    ops::attention_decode(world_ == 1 ? out : mine_out, mine_lse, q, l.k, l.v, slots_, lengths_, step_max_length_,
                          positions_, params);
  }
  if (world_ == 1) return;
  Tensor all = Tensor::empty({world_, n}, acc_, device_);
  {
    ScopedPhase phase(timer, Phase::comm);
    comm.all_gather(mine, all);
  }
  // Every rank merges the same gathered parts in rank order, so all ranks get the same bits.
  const std::array<int64_t, 4> out_shape{world_, rows, hq, dv}, out_strides{n, hq * dv, dv, 1};
  const std::array<int64_t, 3> lse_shape{world_, hq, rows}, lse_strides{n, rows, 1};
  const TensorView parts_out(all.data(), acc_, device_, out_shape, out_strides);
  const TensorView parts_lse(static_cast<char*>(all.data()) + n_out * static_cast<int64_t>(dtype_size(acc_)), acc_,
                             device_, lse_shape, lse_strides);
  Tensor lse = Tensor::empty({hq, rows}, acc_, device_);  // the merged lse (a decode step keeps none)
  ScopedPhase phase(timer, Phase::fa);
  ops::attention_merge_partials(out, lse, parts_out, parts_lse);
}

void KvCache::conv_step(int64_t layer, const TensorView& out, const TensorView& inv_norm, const TensorView& x,
                        const TensorView& w, const ops::GdnQkParams& params) const {
  HYDRA_ASSERT(mode_ == Mode::decode, "conv_step outside a decode step");
  ops::gdn_qkv_conv_step(out, inv_norm, x, w, layers_.at(static_cast<size_t>(layer)).conv_tail, slots_, positions_,
                         params);
}

void KvCache::gdn_step(int64_t layer, const TensorView& out, const TensorView& q, const TensorView& k,
                       const TensorView& v, const TensorView& g, const TensorView& beta,
                       const ops::DeltaRuleParams& params) const {
  HYDRA_ASSERT(mode_ == Mode::decode, "gdn_step outside a decode step");
  ops::delta_rule_step(out, layers_.at(static_cast<size_t>(layer)).state, slots_, q, k, v, g, beta, params);
}

}  // namespace hydra
