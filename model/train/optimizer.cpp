#include "model/train/optimizer.h"

#include <cmath>
#include <numbers>

#include <algorithm>

#include "kernels/adamw/adamw.h"
#include "model/train/objective.h"
#include "runtime/content_hash.h"
#include "model/weight_layout.h"

namespace hydra::train {
namespace {

TensorView flat(const Tensor& t) { return t.view().reshape({-1}); }

}  // namespace

double learning_rate(const OptimizerConfig& c, int64_t step) {
  if (c.warmup > 0 && step <= c.warmup) return c.lr * static_cast<double>(step) / static_cast<double>(c.warmup);
  const int64_t decay_steps = std::max<int64_t>(1, c.total_steps - c.warmup);
  const double progress = std::clamp(static_cast<double>(step - c.warmup) / static_cast<double>(decay_steps), 0.0, 1.0);
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

AdamW::AdamW(Model& model, OptimizerConfig config, const std::function<bool(const std::string&)>& trainable,
             Communicator* world, Zero zero)
    : model_(model), config_(config), trainable_(trainable), world_(world), zero_(zero) {
  const DType acc = model.acc_dtype();
  HYDRA_ASSERT(!world || world->size() == 1 || world->device() == model.device(),
               "the optimizer's communicator ({}) works on another device than the model", world ? world->name() : "");
  if (!sharded()) {
    master_ = model.zeros_like_weights(acc, trainable);
    m_ = model.zeros_like_weights(acc, trainable);
    v_ = model.zeros_like_weights(acc, trainable);
  } else {  // no whole state: layers of undefined tensors, so the segments below get undefined views
    for (ModelTensors* t : {&master_, &m_, &v_}) t->layers.resize(static_cast<size_t>(model.config().num_layers));
  }
  grads_ = model.zeros_like_weights(acc, trainable);
  ModelTensors& weights = model.mutable_weights();
  // Segments are keyed on the gradient tensors (allocated for every trainable tensor); the master
  // and moment views exist only when replicated (an empty tensor gives an undefined view).
  auto add = [&](Tensor& w, Tensor& master, Tensor& m, Tensor& v, Tensor& g, int64_t begin, int64_t count, bool decay) {
    if (!g.defined()) return;
    const auto part = [&](const Tensor& t) { return t.defined() ? flat(t).narrow(0, begin, count) : TensorView(); };
    Segment s{part(master), part(m), part(v), part(g), part(w), decay, g.data()};
    // Merge with the previous segment when it continues it in the same tensor and group.
    if (!segments_.empty()) {
      Segment& last = segments_.back();
      const size_t es = last.grad.element_size();
      if (last.tensor == s.tensor && last.decay == decay &&
          static_cast<char*>(last.grad.data()) + last.grad.numel() * es == s.grad.data()) {
        const int64_t n = last.grad.numel() + count;
        const auto grow = [&](const TensorView& v) {
          return v.defined() ? TensorView(v.data(), v.dtype(), v.device(), {n}) : v;
        };
        last = Segment{grow(last.master), grow(last.m), grow(last.v), grow(last.grad), grow(last.weight), decay, s.tensor};
        trainable_count_ += count;
        return;
      }
    }
    segments_.push_back(s);
    offsets_.push_back(trainable_count_);
    trainable_count_ += count;
  };
  auto whole = [&](Tensor& w, Tensor& master, Tensor& m, Tensor& v, Tensor& g, const std::string& name) {
    add(w, master, m, v, g, 0, w.numel(), param_traits(name).weight_decay);
  };
  whole(weights.embed, master_.embed, m_.embed, v_.embed, grads_.embed, "model.embed_tokens.weight");
  whole(weights.final_norm, master_.final_norm, m_.final_norm, v_.final_norm, grads_.final_norm, "model.norm.weight");
  if (!weights.tied) whole(weights.lm_head, master_.lm_head, m_.lm_head, v_.lm_head, grads_.lm_head, "lm_head.weight");
  for (int64_t l = 0; l < model.config().num_layers; ++l) {
    const LayerLayout& layout = model.layout(l);
    const size_t li = static_cast<size_t>(l);
    std::vector<bool> whole_done(kSlotCount, false);
    // Row pieces in the order of their rows, so adjacent ranges of one group merge.
    std::vector<const Piece*> pieces;
    for (const Piece& p : layout.pieces) pieces.push_back(&p);
    std::stable_sort(pieces.begin(), pieces.end(), [](const Piece* a, const Piece* b) {
      return a->slot != b->slot ? a->slot < b->slot : a->dst_begin < b->dst_begin;
    });
    for (const Piece* p : pieces) {
      const Slot slot = p->slot;
      Tensor& w = weights.layers[li].slot(slot);
      auto args = [&](auto&& f) {
        f(w, master_.layers[li].slot(slot), m_.layers[li].slot(slot), v_.layers[li].slot(slot),
          grads_.layers[li].slot(slot));
      };
      if (p->dim == 1 || (w.rank() == 1 && p->length == w.numel())) {
        if (whole_done[static_cast<size_t>(slot)]) continue;
        whole_done[static_cast<size_t>(slot)] = true;
        args([&](Tensor& a, Tensor& b, Tensor& c, Tensor& d, Tensor& e) { whole(a, b, c, d, e, p->name); });
        continue;
      }
      const int64_t row = w.numel() / w.size(0);
      args([&](Tensor& a, Tensor& b, Tensor& c, Tensor& d, Tensor& e) {
        add(a, b, c, d, e, p->dst_begin * row, p->length * row, param_traits(p->name).weight_decay);
      });
    }
  }
  // The flat space cut into the world's ranges: rank r owns [r·S, (r+1)·S) ∩ [0, N). Both forms cut
  // it (the replicated form reduces its gradients through the same ranges, so that both add the
  // ranks' gradients in one order); a world of one owns everything.
  const int64_t p = world_ ? world_->size() : 1, r = world_ ? world_->rank() : 0, n = trainable_count_;
  shard_stride_ = (n + p - 1) / p;
  own_begin_ = std::min(n, r * shard_stride_);
  own_end_ = std::min(n, (r + 1) * shard_stride_);
  // Buckets: a collective moves W·b elements beside a b-element own part; (W + 1)·b stays within
  // the largest trainable tensor (and 32M elements), so a bucket costs no more than one tensor.
  int64_t largest = 1;
  grads_.for_each([&](const std::string&, Tensor& g) { largest = std::max(largest, g.numel()); });
  bucket_ = std::clamp<int64_t>(std::min<int64_t>(largest, int64_t{1} << 25) / (p + 1), 1, std::max<int64_t>(shard_stride_, 1));
  if (!sharded()) {
    // Masters start as the model's weights (exact on the CPU; bf16 values widened on the GPU).
    for (const Segment& s : segments_) copy_into(s.master, s.weight);
    return;
  }
  // ZeRO-1: this rank's state of its own range, and the update's slices.
  const int64_t own = std::max<int64_t>(own_end_ - own_begin_, 1);
  shard_master_ = Tensor::zeros({own}, acc, model.device());
  shard_m_ = Tensor::zeros({own}, acc, model.device());
  shard_v_ = Tensor::zeros({own}, acc, model.device());
  for_pieces(own_begin_, own_end_, [&](size_t i, int64_t begin, int64_t count) {
    const Segment& s = segments_[i];
    const int64_t at = begin - offsets_[i], local = begin - own_begin_;
    ops::AdamWSlice slice{shard_master_.view().narrow(0, local, count), shard_m_.view().narrow(0, local, count),
                          shard_v_.view().narrow(0, local, count), s.grad.narrow(0, at, count),
                          s.weight.narrow(0, at, count), s.decay};
    copy_into(slice.master, slice.weight);  // the own masters start as the model's weights
    shard_slices_.push_back(slice);
  });
}

void AdamW::for_pieces(int64_t begin, int64_t end, const std::function<void(size_t, int64_t, int64_t)>& f) const {
  end = std::min(end, trainable_count_);
  if (begin >= end) return;
  // The segment holding `begin`: the last whose offset is ≤ begin.
  size_t i = static_cast<size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), begin) - offsets_.begin()) - 1;
  for (int64_t at = begin; at < end; ++i) {
    const int64_t count = std::min(end, offsets_[i] + segments_[i].grad.numel()) - at;
    f(i, at, count);
    at += count;
  }
}

void AdamW::all_gather_flat(const FlatView& src, const FlatView& dst, DType dtype,
                            const std::function<bool(size_t)>& take) const {
  const int64_t p = world_->size(), r = world_->rank();
  const Device device = model_.device();
  // Rank q's part: the pieces of its flat range [q·S, (q+1)·S) ∩ [0, N) whose segments `take`
  // accepts (all without it), laid end to end in flat order; every rank lists every rank's part.
  struct Run {
    size_t segment;
    int64_t begin, count, at;  // flat [begin, begin + count), at `at` in its rank's part
  };
  std::vector<std::vector<Run>> parts(static_cast<size_t>(p));
  int64_t longest = 0;
  for (int64_t q = 0; q < p; ++q) {
    int64_t at = 0;
    for_pieces(q * shard_stride_, (q + 1) * shard_stride_, [&](size_t i, int64_t begin, int64_t count) {
      if (take && !take(i)) return;
      parts[static_cast<size_t>(q)].push_back({i, begin, count, at});
      at += count;
    });
    longest = std::max(longest, at);
  }
  // f(segment, flat begin, count, offset in the bucket) for rank q's pieces within [k, k + b) of its part.
  const auto in_bucket = [&](int64_t q, int64_t k, int64_t b, const auto& f) {
    for (const Run& run : parts[static_cast<size_t>(q)]) {
      const int64_t lo = std::max(run.at, k), hi = std::min(run.at + run.count, k + b);
      if (lo < hi) f(run.segment, run.begin + lo - run.at, hi - lo, lo - k);
    }
  };
  // Bucket k: rank q contributes [k, k + b) of its part; the gathered [W, b] rows land at the same
  // ranges on every rank. A part shorter than the longest is padded: sent, never read.
  const int64_t size = std::clamp<int64_t>(longest, 1, bucket_);
  Tensor send = Tensor::zeros({size}, dtype, device), recv = Tensor::empty({p * size}, dtype, device);
  for (int64_t k = 0; k < longest; k += bucket_) {
    const int64_t b = std::min(bucket_, longest - k);
    in_bucket(r, k, b, [&](size_t i, int64_t begin, int64_t count, int64_t at) {
      copy_into(send.view().narrow(0, at, count), src(i, begin, count));
    });
    world_->all_gather(send.view().narrow(0, 0, b), recv.view().narrow(0, 0, p * b).reshape({p, b}));
    for (int64_t q = 0; q < p; ++q) {
      if (q == r) continue;  // already in place
      in_bucket(q, k, b, [&](size_t i, int64_t begin, int64_t count, int64_t at) {
        copy_into(dst(i, begin, count), recv.view().narrow(0, q * b + at, count));
      });
    }
  }
}

void AdamW::all_gather_weights() const {
  // On the GPU the GEMM weights are bf16 and the norms, gates and convs in the accumulation dtype
  // (Model::place_dtype): each dtype travels at its own precision, in all-gathers of its own, so an
  // owner's f32 weights reach the other ranks unrounded (the replicated form's bits).
  const FlatView weights = [&](size_t i, int64_t begin, int64_t count) {
    return segments_[i].weight.narrow(0, begin - offsets_[i], count);
  };
  std::vector<DType> dtypes;
  for (const Segment& s : segments_) {
    if (std::find(dtypes.begin(), dtypes.end(), s.weight.dtype()) == dtypes.end()) dtypes.push_back(s.weight.dtype());
  }
  for (const DType dtype : dtypes) {
    all_gather_flat(weights, weights, dtype, [&](size_t i) { return segments_[i].weight.dtype() == dtype; });
  }
}

std::vector<TensorView> AdamW::segment_views(ModelTensors& whole) const {
  // `whole` has the layout of grads_: each segment is the same range of the same slot.
  std::vector<const Tensor*> g;
  std::vector<Tensor*> w;
  grads_.for_each([&](const std::string&, const Tensor& t) { g.push_back(&t); });
  whole.for_each([&](const std::string&, Tensor& t) { w.push_back(&t); });
  HYDRA_ASSERT(g.size() == w.size(), "{} gradient tensors, {} state tensors", g.size(), w.size());
  std::vector<TensorView> views;
  for (const Segment& s : segments_) {
    size_t j = 0;
    while (j < g.size() && g[j]->data() != s.tensor) ++j;
    HYDRA_ASSERT(j < g.size(), "a segment outside the gradient tensors");
    const int64_t at = (static_cast<const char*>(s.grad.data()) - static_cast<const char*>(g[j]->data())) /
                       static_cast<int64_t>(s.grad.element_size());
    views.push_back(flat(*w[j]).narrow(0, at, s.grad.numel()));
  }
  return views;
}

ModelTensors AdamW::gathered(const Tensor& shard) const {
  ModelTensors whole = model_.zeros_like_weights(model_.acc_dtype(), trainable_);
  const std::vector<TensorView> views = segment_views(whole);
  const FlatView dst = [&](size_t i, int64_t begin, int64_t count) { return views[i].narrow(0, begin - offsets_[i], count); };
  const FlatView src = [&](size_t, int64_t begin, int64_t count) { return shard.view().narrow(0, begin - own_begin_, count); };
  for_pieces(own_begin_, own_end_, [&](size_t i, int64_t begin, int64_t count) {
    copy_into(dst(i, begin, count), src(i, begin, count));
  });
  all_gather_flat(src, dst, model_.acc_dtype());
  return whole;
}

void AdamW::zero_grads() {
  std::vector<TensorView> all;
  grads_.for_each([&](const std::string&, Tensor& g) { all.push_back(g.view()); });
  ops::zero_tensors(all);  // one launch on the GPU
}

void AdamW::reduce_gradients() {
  if (!world_ || world_->size() == 1) return;
  // Bucket k: row q of the [W, b] send buffer is this rank's gradient over rank q's flat range
  // [q·S + k, q·S + k + b) (zero past N); the reduce-scatter leaves the sum of row r, this rank's
  // own range, which goes back into grads() where the update reads it.
  const int64_t p = world_->size(), r = world_->rank();
  const DType acc = model_.acc_dtype();
  const Device device = model_.device();
  Tensor send = Tensor::empty({p * bucket_}, acc, device), recv = Tensor::empty({bucket_}, acc, device);
  for (int64_t k = 0; k < shard_stride_; k += bucket_) {
    const int64_t b = std::min(bucket_, shard_stride_ - k);
    if ((p - 1) * shard_stride_ + k + b > trainable_count_) {  // the last rank's row reaches past N: zero it all
      const TensorView all[] = {send.view().narrow(0, 0, p * b)};
      ops::zero_tensors(all);
    }
    for (int64_t q = 0; q < p; ++q) {
      const int64_t theirs = q * shard_stride_ + k;
      for_pieces(theirs, theirs + b, [&](size_t i, int64_t begin, int64_t count) {
        copy_into(send.view().narrow(0, q * b + begin - theirs, count),
                  segments_[i].grad.narrow(0, begin - offsets_[i], count));
      });
    }
    world_->reduce_scatter_sum(send.view().narrow(0, 0, p * b).reshape({p, b}), recv.view().narrow(0, 0, b));
    const int64_t mine = r * shard_stride_ + k;
    for_pieces(mine, mine + b, [&](size_t i, int64_t begin, int64_t count) {
      copy_into(segments_[i].grad.narrow(0, begin - offsets_[i], count), recv.view().narrow(0, begin - mine, count));
    });
  }
  if (sharded()) return;
  // Replicated: every rank needs the whole sum. The owners' sums are all-gathered in the same
  // buckets, so each element is the sum the sharded form computes, added in the same order
  // (an all-reduce would add them in its own order: the two forms would differ in the last bits).
  const FlatView grads = [&](size_t i, int64_t begin, int64_t count) {
    return segments_[i].grad.narrow(0, begin - offsets_[i], count);
  };
  all_gather_flat(grads, grads, acc);
}

std::vector<TensorView> AdamW::own_gradients() const {
  std::vector<TensorView> grads;
  for_pieces(own_begin_, own_end_, [&](size_t i, int64_t begin, int64_t count) {
    grads.push_back(segments_[i].grad.narrow(0, begin - offsets_[i], count));
  });
  return grads;
}

double AdamW::grad_norm() {
  // The own range's sum of squares (one synchronisation for all its pieces), added over the world:
  // the same pieces and the same additions in both forms.
  const double own = ops::sum_of_squares(own_gradients());
  if (!world_ || world_->size() == 1) return std::sqrt(own);
  Tensor sum = Tensor::empty({1}, DType::f64);
  sum.data_as<double>()[0] = own;
  all_reduce_sum_host(*world_, sum);
  return std::sqrt(sum.data_as<double>()[0]);
}

StepStats AdamW::stats(int64_t step, double grad_norm) const {
  StepStats stats;
  stats.grad_norm = grad_norm;
  stats.lr = learning_rate(config_, step);
  if (config_.grad_clip > 0 && stats.grad_norm > config_.grad_clip) stats.clip_scale = config_.grad_clip / stats.grad_norm;
  return stats;
}

void AdamW::schedule_device_step(int64_t step) {
  HYDRA_ASSERT(device_update_possible(), "a device update over a world of {} ranks", world_->size());
  if (!device_update_) {
    std::vector<ops::AdamWSlice> slices;
    for (const Segment& s : segments_) slices.push_back({s.master, s.m, s.v, s.grad, s.weight, s.decay});
    std::vector<TensorView> zero;
    grads_.for_each([&](const std::string&, Tensor& g) { zero.push_back(g.view()); });
    device_update_ = std::make_unique<ops::DeviceUpdate>(
        slices, own_gradients(), zero,
        ops::AdamWParams{.beta1 = static_cast<float>(config_.beta1), .beta2 = static_cast<float>(config_.beta2),
                         .eps = static_cast<float>(config_.eps), .weight_decay = static_cast<float>(config_.weight_decay)},
        config_.grad_clip, model_.device());
  }
  device_update_->write_schedule(static_cast<float>(learning_rate(config_, step)), step);  // step()'s lr
}

void AdamW::queue_device_step(const TensorView& loss_sums, const TensorView& result) {
  HYDRA_ASSERT(device_update_ != nullptr, "queue_device_step before schedule_device_step");
  device_update_->launch(loss_sums, result);
}

StepStats AdamW::step(int64_t step, double grad_norm) {
  const StepStats stats = this->stats(step, grad_norm);
  std::vector<ops::AdamWSlice> slices;
  if (sharded()) {
    slices = shard_slices_;  // the own range: its masters, moments, reduced gradient and the model's weights there
  } else {
    slices.reserve(segments_.size());
    for (const Segment& s : segments_) slices.push_back({s.master, s.m, s.v, s.grad, s.weight, s.decay});
  }
  ops::adamw_update(slices, ops::AdamWParams{.lr = static_cast<float>(stats.lr),
                                             .beta1 = static_cast<float>(config_.beta1),
                                             .beta2 = static_cast<float>(config_.beta2),
                                             .eps = static_cast<float>(config_.eps),
                                             .weight_decay = static_cast<float>(config_.weight_decay),
                                             .step = step,
                                             .grad_scale = static_cast<float>(stats.clip_scale)});  // one launch on the GPU
  if (sharded()) {
    // Every owner's updated weights to every rank (on the GPU the collectives queue behind the update).
    all_gather_weights();
  }
  return stats;
}

NamedTensors AdamW::state(bool wanted) const {
  NamedTensors out;
  if (sharded()) {
    // One kind at a time, so at most one whole copy on the device beside the host output.
    for (const auto& [prefix, shard] : {std::pair<const char*, const Tensor*>{"master.", &shard_master_},
                                        {"adam_m.", &shard_m_}, {"adam_v.", &shard_v_}}) {
      const ModelTensors whole = gathered(*shard);
      if (!wanted) continue;
      for (auto& [name, t] : model_.unpack(whole)) out.emplace(prefix + name, std::move(t));
    }
    return out;
  }
  if (!wanted) return out;
  for (const auto& [prefix, tensors] : {std::pair<const char*, const ModelTensors*>{"master.", &master_},
                                        {"adam_m.", &m_}, {"adam_v.", &v_}}) {
    for (auto& [name, t] : model_.unpack(*tensors)) out.emplace(prefix + name, std::move(t));
  }
  return out;
}

void AdamW::load_state(const NamedTensors& state) {
  // Checks the state holds every tensor of this model and packs it into the runtime layout.
  const auto pack = [&](const char* prefix, ModelTensors& into) {
    NamedTensors part;
    for (const auto& [name, t] : model_.unpack(into)) {
      const auto it = state.find(prefix + name);
      HYDRA_USER_CHECK(it != state.end(), "training state lacks '{}{}' (saved for another model or stage?)", prefix, name);
      HYDRA_USER_CHECK(it->second.numel() == t.numel(), "training state '{}{}' has shape {}, the model needs {}", prefix,
                       name, it->second.shape_string(), t.shape_string());
      part.emplace(name, it->second);
    }
    model_.pack(part, into);
  };
  if (!sharded()) {
    for (const auto& [prefix, tensors] : {std::pair<const char*, ModelTensors*>{"master.", &master_}, {"adam_m.", &m_},
                                          {"adam_v.", &v_}}) {
      pack(prefix, *tensors);
    }
    for (const Segment& s : segments_) copy_into(s.weight, s.master);
    return;
  }
  // Sharded: each kind packed whole (a temporary), of which this rank keeps its own range, whatever
  // world the state was saved on; the weights come from the whole masters, as replicated, so no
  // collective is needed.
  for (const auto& [prefix, shard] : {std::pair<const char*, Tensor*>{"master.", &shard_master_},
                                      {"adam_m.", &shard_m_}, {"adam_v.", &shard_v_}}) {
    ModelTensors whole = model_.zeros_like_weights(model_.acc_dtype(), trainable_);
    pack(prefix, whole);
    const std::vector<TensorView> views = segment_views(whole);
    if (std::string(prefix) == "master.") {
      for (size_t i = 0; i < segments_.size(); ++i) copy_into(segments_[i].weight, views[i]);
    }
    for_pieces(own_begin_, own_end_, [&](size_t i, int64_t begin, int64_t count) {
      copy_into(shard->view().narrow(0, begin - own_begin_, count), views[i].narrow(0, begin - offsets_[i], count));
    });
  }
}

NamedTensors AdamW::master_parameters(bool wanted) const {
  if (!wanted) {
    if (sharded()) gathered(shard_master_);  // this rank's part of the collective
    return {};
  }
  NamedTensors out = model_.unpack(model_.weights());
  for (auto& [name, t] : model_.unpack(sharded() ? gathered(shard_master_) : master_)) out[name] = std::move(t);
  return out;
}

Tensor AdamW::own_state(Kind kind) const {
  const int64_t own = own_end_ - own_begin_;
  Tensor out = Tensor::empty({own}, model_.acc_dtype(), Device::host);
  if (sharded()) {
    const Tensor& shard = kind == Kind::master ? shard_master_ : kind == Kind::m ? shard_m_ : shard_v_;
    if (own > 0) copy_into(out.view(), shard.view().narrow(0, 0, own));
    return out;
  }
  for_pieces(own_begin_, own_end_, [&](size_t i, int64_t begin, int64_t count) {
    const Segment& s = segments_[i];
    const TensorView& whole = kind == Kind::master ? s.master : kind == Kind::m ? s.m : s.v;
    copy_into(out.view().narrow(0, begin - own_begin_, count), whole.narrow(0, begin - offsets_[i], count));
  });
  return out;
}

void AdamW::load_flat_state(const std::function<void(Kind, int64_t, const TensorView&)>& read) {
  const DType acc = model_.acc_dtype();
  if (sharded()) {
    const int64_t own = own_end_ - own_begin_;
    for (const auto& [kind, shard] : {std::pair<Kind, Tensor*>{Kind::master, &shard_master_}, {Kind::m, &shard_m_},
                                      {Kind::v, &shard_v_}}) {
      if (own == 0) continue;
      Tensor host = Tensor::empty({own}, acc, Device::host);
      read(kind, own_begin_, host.view());
      copy_into(shard->view().narrow(0, 0, own), host.view());
    }
    // The own weights from the own masters, then every owner's to every rank.
    for (const ops::AdamWSlice& s : shard_slices_) copy_into(s.weight, s.master);
    all_gather_weights();
    return;
  }
  Tensor host = Tensor::empty({std::max<int64_t>(trainable_count_, 1)}, acc, Device::host);
  for (const Kind kind : {Kind::master, Kind::m, Kind::v}) {
    read(kind, 0, host.view().narrow(0, 0, trainable_count_));
    for (size_t i = 0; i < segments_.size(); ++i) {
      const Segment& s = segments_[i];
      const TensorView& whole = kind == Kind::master ? s.master : kind == Kind::m ? s.m : s.v;
      copy_into(whole, host.view().narrow(0, offsets_[i], whole.numel()));
    }
  }
  for (const Segment& s : segments_) copy_into(s.weight, s.master);
}

uint64_t AdamW::flat_layout_hash() const {
  std::vector<int64_t> table;
  for (size_t i = 0; i < segments_.size(); ++i) {
    table.insert(table.end(), {offsets_[i], segments_[i].grad.numel(), segments_[i].decay ? 1 : 0});
  }
  table.push_back(trainable_count_);
  return hash_bytes(table.data(), table.size() * sizeof(int64_t));
}

}  // namespace hydra::train
