// The fixed step of `hydra train --cuda-graph on` (DESIGN.md §1.5 "The step as a CUDA graph"): the
// micro-batches' forward and backward asking for the same memory and reading their inputs from the
// same buffers every step, so that they can be captured as a CUDA graph once and replayed.
//
// What a step does here (trainer.cpp calls launch() and later collect() in place of its loop over
// stage_loss; launch() queues 1-3 and the copy of 4, collect() waits for that copy):
//  1. host work, eager: each micro-batch's ids, targets and answer marks are copied into this
//     object's persistent buffers ([T_loc] i32 each, one set per micro-batch) and the step's gradient
//     scale 1 / counted into a device scalar — queued on the stream before the work that reads them;
//  2. the work: the loss accumulators zeroed, then stage_loss of each micro-batch inside the
//     StepArena (runtime/step_arena.h; begun again for each micro-batch, whose tensors are all dead
//     when it returns, so the micro-batches share the blocks: the arena holds the sum of ONE
//     micro-batch's allocations, not its peak), with a DeviceLossHead (objective.h): the loss sums
//     go to device buffers [G, 2], the scale is read from the device. No host read, no phase timer;
//  3. with a tail (the optimizer's device update: a world of one, trainer.cpp), the gradient norm,
//     clip scale, non-finite guard, AdamW and the zeroing of the gradients queued behind the
//     micro-batches, reading and writing only device buffers (ops::DeviceUpdate), so the graph holds
//     the whole step;
//  4. the sums ([G, 2] f64, with the tail's result [3] f64: one buffer, one copy) copied behind the
//     work into one of two pinned host slots (runtime/host_readback.h), so a second step can be
//     launched before the first is collected; collect() waits for the oldest step's copy and adds
//     its sums in micro-batch order, as the eager loop adds. The inputs of a step launched while
//     another runs are written in stream order behind it; a graph is dropped (re-captured) only once
//     the steps launched from it have finished.
//
// StepMode::graph (the GPU): the first step of a shape runs the work eagerly (the arena's blocks are
// allocated), the next step of the same shape captures it (runtime/cuda_graph.h) and launches it, and
// later steps of that shape only do 1 and launch. A shape is the document starts of every
// micro-batch (the layout's: what the attention masks, RoPE positions and the GDN scan's runs are
// built from on the host, and uploaded inside the capture from pinned copies frozen at capture).
// Windows are their own documents, so a step's shape changes only when the data has document
// boundaries inside windows: such a step runs eagerly (still in the arena), counted, and a graph whose
// blocks moved is dropped (captured again at the next two steps of one shape). StepMode::fixed runs
// 1-4 eagerly every step on any device: what the CPU tests check (same losses and weights as the
// eager loop, bit for bit on the CPU; no fresh block after the first step).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "model/train/stage.h"
#include "model/train/trainer.h"
#include "runtime/cuda_graph.h"
#include "runtime/host_readback.h"
#include "runtime/step_arena.h"

namespace hydra::train {

class FixedStep {
 public:
  // Buffers for `micro_batches` micro-batches of `rows` rows (this rank's T_loc) on the model's device.
  FixedStep(StepMode mode, const Model& model, int64_t micro_batches, int64_t rows);
  ~FixedStep();  // waits for the launched steps (the graph and the read slots outlive them)
  FixedStep(const FixedStep&) = delete;
  FixedStep& operator=(const FixedStep&) = delete;

  // What the step queues after the micro-batches (3 above): given the loss sums [G, 2] f64 and the
  // result [3] f64 (persistent device buffers), it queues device work only.
  using Tail = std::function<void(const TensorView& loss_sums, const TensorView& result)>;

  // The micro-batches' forward and backward into `grads` (added to), scaled by 1 / counted, then
  // `tail` when given (the same tail every step: a graph captured with it replays it), queued
  // (1-3 above), and the read of its results queued behind them; nothing waits. At most two steps
  // may be launched and not yet collected (the read's two slots).
  void launch(const StageRun& stage, const std::vector<StageBatch>& batches, int64_t counted, ModelTensors& grads,
              const Tail& tail = {});
  // What a launched step left, read when it has finished (4 above).
  struct Collected {
    LossSums sums;                      // over the micro-batches (the counts from the batches' own)
    std::array<double, 3> tail_result{};  // ops::DeviceUpdate::Slot; zeros without a tail
    bool graph = false;                 // the step replayed the graph
    size_t fresh_blocks = 0;            // tensor blocks the step allocated
  };
  // Waits for the oldest launched step not yet collected and returns its results.
  Collected collect();
  int launched_steps() const { return static_cast<int>(in_flight_.size()); }  // launched, not collected
  // launch() then collect(): the step as one call, waiting for its end.
  Collected run(const StageRun& stage, const std::vector<StageBatch>& batches, int64_t counted, ModelTensors& grads,
                const Tail& tail = {});

  size_t arena_blocks() const { return arena_.blocks(); }
  double arena_bytes() const { return arena_.bytes(); }

 private:
  using Shape = std::vector<std::vector<int64_t>>;  // the document starts of each micro-batch
  void work(const StageRun& run, const std::vector<StageBatch>& batches, ModelTensors& grads, const Tail& tail);
  TensorView sums() const;    // [G, 2] f64 of readout_
  TensorView result() const;  // [3] f64 of readout_

  const StepMode mode_;
  const Device device_;
  const int64_t rows_;
  std::vector<Tensor> ids_, targets_, answer_;  // per micro-batch [T_loc] i32 on the device
  const int64_t groups_;
  Tensor readout_;                              // [2G + 3] f64 on the device: sums(), then result()
  Tensor zero_sums_;                            // [G, 2] f64 on the device: zeros
  Tensor scale_, scale_host_;                   // [1] f32 on the device / host: 1 / counted
  StepArena arena_;
  CudaGraph graph_;
  Shape graph_shape_, warm_shape_;
  bool graph_ready_ = false, warm_ = false, graph_tail_ = false;
  // Launched steps not yet collected, oldest first: the readout's slot and what the host knows.
  struct InFlight {
    int slot = 0;
    LossSums counts;  // tokens and answer tokens (the sums come from the device)
    bool graph = false, tail = false;
    size_t fresh_blocks = 0;
  };
  std::deque<InFlight> in_flight_;
  HostReadback readback_;  // two slots of readout_ (model/train/fixed_step.h 4)
  int next_slot_ = 0;
  size_t fresh_ = 0;
};

}  // namespace hydra::train
