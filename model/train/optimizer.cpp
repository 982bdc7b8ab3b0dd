#include "model/train/optimizer.h"

#include <cmath>
#include <numbers>

#include "kernels/adamw/adamw.h"
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

AdamW::AdamW(Model& model, OptimizerConfig config, const std::function<bool(const std::string&)>& trainable)
    : model_(model), config_(config) {
  const DType acc = model.acc_dtype();
  master_ = model.zeros_like_weights(acc, trainable);
  m_ = model.zeros_like_weights(acc, trainable);
  v_ = model.zeros_like_weights(acc, trainable);
  grads_ = model.zeros_like_weights(acc, trainable);
  // Masters start as the model's weights (exact on the CPU; bf16 values widened on the GPU).
  ModelTensors& weights = model.mutable_weights();
  auto add = [&](Tensor& w, Tensor& master, Tensor& m, Tensor& v, Tensor& g, int64_t begin, int64_t count, bool decay) {
    if (!master.defined()) return;
    Segment s{flat(master).narrow(0, begin, count), flat(m).narrow(0, begin, count), flat(v).narrow(0, begin, count),
              flat(g).narrow(0, begin, count), flat(w).narrow(0, begin, count), decay, master.data()};
    // Merge with the previous segment when it continues it in the same tensor and group.
    if (!segments_.empty()) {
      Segment& last = segments_.back();
      const size_t es = last.master.element_size();
      if (last.tensor == s.tensor && last.decay == decay &&
          static_cast<char*>(last.master.data()) + last.master.numel() * es == s.master.data()) {
        const int64_t n = last.master.numel() + count;
        const auto grow = [&](const TensorView& v) { return TensorView(v.data(), v.dtype(), v.device(), {n}); };
        last = Segment{grow(last.master), grow(last.m), grow(last.v), grow(last.grad), grow(last.weight), decay, s.tensor};
        trainable_count_ += count;
        return;
      }
    }
    segments_.push_back(s);
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
  for (const Segment& s : segments_) copy_into(s.master, s.weight);
}

void AdamW::zero_grads() {
  std::vector<TensorView> all;
  grads_.for_each([&](const std::string&, Tensor& g) { all.push_back(g.view()); });
  ops::zero_tensors(all);  // one launch on the GPU
}

double AdamW::grad_norm() const {
  std::vector<TensorView> grads;
  for (const Segment& s : segments_) grads.push_back(s.grad);
  return std::sqrt(ops::sum_of_squares(grads));  // one synchronisation for all segments
}

StepStats AdamW::step(int64_t step, double grad_norm) {
  StepStats stats;
  stats.grad_norm = grad_norm;
  stats.lr = learning_rate(config_, step);
  if (config_.grad_clip > 0 && stats.grad_norm > config_.grad_clip) stats.clip_scale = config_.grad_clip / stats.grad_norm;
  std::vector<ops::AdamWSlice> slices;
  slices.reserve(segments_.size());
  for (const Segment& s : segments_) slices.push_back({s.master, s.m, s.v, s.grad, s.weight, s.decay});
  ops::adamw_update(slices, ops::AdamWParams{.lr = static_cast<float>(stats.lr),
                                             .beta1 = static_cast<float>(config_.beta1),
                                             .beta2 = static_cast<float>(config_.beta2),
                                             .eps = static_cast<float>(config_.eps),
                                             .weight_decay = static_cast<float>(config_.weight_decay),
                                             .step = step,
                                             .grad_scale = static_cast<float>(stats.clip_scale)});  // one launch on the GPU
  return stats;
}

NamedTensors AdamW::state() const {
  NamedTensors out;
  for (const auto& [prefix, tensors] : {std::pair<const char*, const ModelTensors*>{"master.", &master_},
                                        {"adam_m.", &m_}, {"adam_v.", &v_}}) {
    for (auto& [name, t] : model_.unpack(*tensors)) out.emplace(prefix + name, std::move(t));
  }
  return out;
}

void AdamW::load_state(const NamedTensors& state) {
  for (const auto& [prefix, tensors] : {std::pair<const char*, ModelTensors*>{"master.", &master_}, {"adam_m.", &m_},
                                        {"adam_v.", &v_}}) {
    NamedTensors part;
    for (const auto& [name, t] : model_.unpack(*tensors)) {
      const auto it = state.find(prefix + name);
      HYDRA_USER_CHECK(it != state.end(), "training state lacks '{}{}' (saved for another model or stage?)", prefix, name);
      HYDRA_USER_CHECK(it->second.numel() == t.numel(), "training state '{}{}' has shape {}, the model needs {}", prefix,
                       name, it->second.shape_string(), t.shape_string());
      part.emplace(name, it->second);
    }
    model_.pack(part, *tensors);
  }
  for (const Segment& s : segments_) copy_into(s.weight, s.master);
}

NamedTensors AdamW::master_parameters() const {
  NamedTensors out = model_.unpack(model_.weights());
  for (auto& [name, t] : model_.unpack(master_)) out[name] = std::move(t);
  return out;
}

}  // namespace hydra::train
