// AdamW over a model's runtime tensors (DESIGN.md §1.5): fp32 master weights and moments, the model's
// own weights (bf16 on the GPU) rewritten from the masters after every step, global-norm clipping on
// the fully reduced gradient, linear warmup then cosine decay, and parameter groups taken from the
// weight layout: no weight decay on norms, gates, A_log, dt_bias and γ (model/weight_layout.h
// param_traits), and a trainable set per stage (the others get no gradient tensor at all and stay
// bit-identical).
//
// Updates run per contiguous segment of a runtime tensor that shares one group: the fused input
// projection holds gate rows (no decay) beside projection rows (decay), so it is updated in row
// ranges; its zero padding rows belong to no parameter and are never touched. On the GPU all
// segments are one launch (ops::adamw_update's list form), as are the zeroing of the gradients and
// their norm.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/model.h"

namespace hydra::train {

struct OptimizerConfig {
  double lr = 3e-4;        // peak learning rate
  double min_lr = 3e-5;    // reached at the last step (cosine)
  int64_t warmup = 0;      // linear warmup steps from 0 to lr
  int64_t total_steps = 1;
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double grad_clip = 1.0;  // max global gradient norm (0: no clipping)
};

// Learning rate of (1-based) step s: lr·s/warmup during warmup, then cosine from lr to min_lr.
double learning_rate(const OptimizerConfig& config, int64_t step);

struct StepStats {
  double grad_norm = 0;    // of the reduced gradient, before clipping
  double clip_scale = 1;   // factor applied to the gradient
  double lr = 0;
};

class AdamW {
 public:
  // `trainable(name)` decides per checkpoint parameter name; weights of `model` are updated in place.
  AdamW(Model& model, OptimizerConfig config, const std::function<bool(const std::string&)>& trainable);

  // Gradient accumulators in the runtime layout (acc dtype), undefined for frozen tensors.
  ModelTensors& grads() { return grads_; }
  void zero_grads();
  // The global L2 norm of grads() (call after the cross-rank reduction; every rank gets the same).
  double grad_norm() const;
  // One update with the gradient in grads(), whose norm (grad_norm()) the caller has checked; `step`
  // is 1-based. Returns what it applied.
  StepStats step(int64_t step, double grad_norm);

  // The state (checkpoint names, host f32): "master.NAME", "adam_m.NAME", "adam_v.NAME" for each
  // trainable parameter. load_state() restores it exactly and rewrites the model's weights.
  NamedTensors state() const;
  void load_state(const NamedTensors& state);
  // The master weights as a checkpoint (every parameter: frozen ones from the model).
  NamedTensors master_parameters() const;
  int64_t trainable_parameters() const { return trainable_count_; }

 private:
  struct Segment {
    TensorView master, m, v, grad, weight;  // flat [n] views of one contiguous range (owned by the ModelTensors)
    bool decay = true;
    const void* tensor = nullptr;  // the runtime tensor the views belong to (segments merge only within one)
  };
  Model& model_;
  OptimizerConfig config_;
  ModelTensors master_, m_, v_, grads_;
  std::vector<Segment> segments_;
  int64_t trainable_count_ = 0;
};

}  // namespace hydra::train
