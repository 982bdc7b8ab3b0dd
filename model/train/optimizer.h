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
//
// ZeRO-1 (Zero::sharded, DESIGN.md §1.5): the trainable elements, segment after segment, form one
// flat index space of N elements; rank r of the world owns the contiguous range [r·S, (r+1)·S) ∩
// [0, N), S = ⌈N/W⌉, and holds the fp32 masters and both moments of that range only (12·N/W bytes
// instead of 12·N). Every rank still accumulates the whole gradient (its tokens' contributions);
// reduce_gradients() reduce-scatters it into the owners in buckets (each rank's part of a bucket
// a contiguous run of the flat space, so one collective moves W·b elements), grad_norm() adds the
// owners' sums of squares, step() updates the own range and all-gathers the model's weights back
// in the same buckets. The replicated form (Zero::replicated, --zero 0) holds the whole state on
// every rank and updates everything there; its gradients go through the same bucketed
// reduce-scatter, then an all-gather of the sums, and its norm adds the same per-rank sums of
// squares: both forms add the ranks' contributions in one order, so they agree bit for bit (an
// all-reduce per tensor adds them in another order, which Adam's 1/sqrt(v) turned into 2e-5
// relative differences of fp32 weights over 20 steps).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/adamw/adamw.h"
#include "model/model.h"
#include "parallel/communicator.h"

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

// Where the masters and moments live: every rank holds all of them (--zero 0), or each rank its
// 1/W of them (--zero 1, ZeRO-1).
enum class Zero { replicated = 0, sharded = 1 };

class AdamW {
 public:
  // `trainable(name)` decides per checkpoint parameter name; weights of `model` are updated in place.
  // `world` (the communicator of the model's device; null: a world of one) is where the gradients
  // are reduced and, with Zero::sharded, where the state is spread. Collective over `world`.
  AdamW(Model& model, OptimizerConfig config, const std::function<bool(const std::string&)>& trainable,
        Communicator* world = nullptr, Zero zero = Zero::replicated);

  // Gradient accumulators in the runtime layout (acc dtype), undefined for frozen tensors.
  ModelTensors& grads() { return grads_; }
  void zero_grads();
  // Sums every rank's grads() over the world (collective): reduce-scattered in buckets so that this
  // rank's own range holds the sum; replicated, the sums are then all-gathered into every range.
  void reduce_gradients();
  // The global L2 norm of the reduced gradient, the same on every rank (collective when sharded:
  // the owners' sums of squares added over the world).
  double grad_norm();
  // One update with the reduced gradient, whose norm (grad_norm()) the caller has checked; `step`
  // is 1-based. Collective when sharded (the weights are all-gathered). Returns what it applied.
  StepStats step(int64_t step, double grad_norm);

  // ---- The update as device work (DESIGN.md §1.5 "The step as a CUDA graph") ----
  // In a world of one, grad_norm() → the non-finite check → step() → zero_grads() can instead be
  // queued as device work that reads nothing back (ops::DeviceUpdate), which a CUDA graph of the
  // step captures beside the forward and backward. Bit-identical to the eager calls.
  bool device_update_possible() const { return !world_ || world_->size() == 1; }
  // Before the step's work is queued (outside a capture): its lr and number into the device scalars.
  void schedule_device_step(int64_t step);
  // Queues the tail on the current stream: loss_sums [G, 2] f64 (its Σ must be finite), result [3]
  // f64 (ops::DeviceUpdate::Slot: the norm, the clip scale, skipped — sticky, read first).
  void queue_device_step(const TensorView& loss_sums, const TensorView& result);
  // What step() would have returned, from the norm the device step formed.
  StepStats stats(int64_t step, double grad_norm) const;

  // The state (checkpoint names, host f32): "master.NAME", "adam_m.NAME", "adam_v.NAME" for each
  // trainable parameter. load_state() restores it exactly and rewrites the model's weights. Both
  // are collective when sharded (state() gathers the shards, one kind at a time through a whole
  // copy on the device; load_state() takes this rank's range of the whole state, so a state saved
  // on any world size loads on any other). `wanted` false: this rank only takes part in the
  // gathering and gets nothing back (no host copy).
  NamedTensors state(bool wanted = true) const;
  void load_state(const NamedTensors& state);
  // The master weights as a checkpoint (every parameter: frozen ones from the model). Collective
  // when sharded, as state().
  NamedTensors master_parameters(bool wanted = true) const;
  int64_t trainable_parameters() const { return trainable_count_; }

  // ---- The flat state, range by range (checkpoint shards: model/train/shards.h) ----
  enum class Kind { master, m, v };
  // This rank's own range [own_begin, own_end) of one kind, a host copy in the accumulation dtype
  // (both forms; no collective).
  Tensor own_state(Kind kind) const;
  // Restores the state from flat ranges saved on any world size: read(kind, begin, out) fills
  // `out` (host, accumulation dtype) with the saved elements [begin, begin + out.numel()). Sharded,
  // each rank reads its own range and the weights are all-gathered (collective); replicated, every
  // rank reads the whole range. The model's weights are rewritten from the masters.
  void load_flat_state(const std::function<void(Kind, int64_t, const TensorView&)>& read);
  // XXH3 of the flat space's cut into segments (each one's length, offset and weight-decay group):
  // equal for two optimizers whose flat spaces mean the same parameters in the same order.
  uint64_t flat_layout_hash() const;
  Zero zero() const { return zero_; }
  // This rank's flat range of the trainable elements [begin, end) (everything in a world of one).
  std::pair<int64_t, int64_t> own_range() const { return {own_begin_, own_end_}; }

 private:
  struct Segment {
    TensorView master, m, v, grad, weight;  // flat [n] views of one contiguous range (owned by the ModelTensors);
                                            // master, m, v undefined when sharded
    bool decay = true;
    const void* tensor = nullptr;  // the runtime tensor the views belong to (segments merge only within one)
  };
  // A view of the flat range [begin, begin + count), which lies within segment `segment`.
  using FlatView = std::function<TensorView(size_t segment, int64_t begin, int64_t count)>;
  // Calls f(segment, begin, count) for the pieces of the flat range [begin, end) ∩ [0, N).
  void for_pieces(int64_t begin, int64_t end, const std::function<void(size_t, int64_t, int64_t)>& f) const;
  // Every rank's own range of `src` lands in `dst` on every rank (bucketed all-gathers in `dtype`);
  // with `take`, only the pieces of the segments it accepts.
  void all_gather_flat(const FlatView& src, const FlatView& dst, DType dtype,
                       const std::function<bool(size_t)>& take = {}) const;
  // Every owner's weights to every rank, each weight dtype in its own all-gathers.
  void all_gather_weights() const;
  // The flat view of each segment's range within `whole` (a ModelTensors in the layout of grads_).
  std::vector<TensorView> segment_views(ModelTensors& whole) const;
  // The reduced gradient's pieces over this rank's own range.
  std::vector<TensorView> own_gradients() const;
  // A sharded kind of state (masters, m or v) as whole tensors on every rank, gathered from the owners.
  ModelTensors gathered(const Tensor& shard) const;
  bool sharded() const { return zero_ == Zero::sharded && world_ && world_->size() > 1; }

  Model& model_;
  OptimizerConfig config_;
  std::function<bool(const std::string&)> trainable_;
  Communicator* world_ = nullptr;
  Zero zero_ = Zero::replicated;
  ModelTensors master_, m_, v_, grads_;  // master_, m_, v_ empty when sharded
  std::vector<Segment> segments_;
  std::vector<int64_t> offsets_;  // flat index of each segment's first element
  int64_t trainable_count_ = 0;
  // The flat range this rank owns, the per-rank stride S and the bucket's per-rank length (both
  // forms); sharded, the state of the own range with its update slices.
  int64_t own_begin_ = 0, own_end_ = 0, shard_stride_ = 0, bucket_ = 0;
  Tensor shard_master_, shard_m_, shard_v_;  // [own_end − own_begin] acc
  std::vector<ops::AdamWSlice> shard_slices_;
  std::unique_ptr<ops::DeviceUpdate> device_update_;  // made at the first schedule_device_step()
};

}  // namespace hydra::train
