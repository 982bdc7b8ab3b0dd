// The fixed step (fixed_step.h): persistent inputs, the step arena, the loss sums on the device, and
// the CUDA graph of the micro-batches' work.
#include "model/train/fixed_step.h"

#include <string>

#include "runtime/error.h"

namespace hydra::train {

FixedStep::FixedStep(StepMode mode, const Model& model, int64_t micro_batches, int64_t rows)
    : mode_(mode),
      device_(model.device()),
      rows_(rows),
      groups_(micro_batches),
      readback_(static_cast<size_t>(2 * micro_batches + 3) * sizeof(double), 2) {
  HYDRA_ASSERT(mode != StepMode::eager && micro_batches >= 1 && rows >= 1, "a fixed step of {} micro-batches of {} rows",
               micro_batches, rows);
  HYDRA_ASSERT(mode != StepMode::graph || device_ == Device::cuda, "a CUDA graph of the training step on {}",
               device_name(device_));
  for (int64_t m = 0; m < micro_batches; ++m) {
    ids_.push_back(Tensor::zeros({rows}, DType::i32, device_, "step token ids"));
    targets_.push_back(Tensor::zeros({rows}, DType::i32, device_, "step targets"));
    answer_.push_back(Tensor::zeros({rows}, DType::i32, device_, "step answer marks"));
  }
  zero_sums_ = Tensor::zeros({micro_batches, 2}, DType::f64, device_, "step loss sums (zero)");
  // Sticky: the tail's "skipped" slot starts at 0 and is never cleared (a skipped step ends the run).
  readout_ = Tensor::zeros({2 * micro_batches + 3}, DType::f64, device_, "step loss sums and update result");
  scale_ = Tensor::zeros({1}, DType::f32, device_, "step gradient scale");
  scale_host_ = Tensor::zeros({1}, DType::f32, Device::host);
}

TensorView FixedStep::sums() const { return readout_.view().narrow(0, 0, 2 * groups_).reshape({groups_, 2}); }
TensorView FixedStep::result() const { return readout_.view().narrow(0, 2 * groups_, 3); }

void FixedStep::work(const StageRun& run, const std::vector<StageBatch>& batches, ModelTensors& grads,
                     const Tail& tail) {
  copy_into(sums(), zero_sums_.view());  // a device copy: a node of the graph, not a host write
  fresh_ = 0;
  for (size_t m = 0; m < batches.size(); ++m) {
    const DeviceLossHead head{.sums = sums().select(0, static_cast<int64_t>(m)), .answer = answer_[m].view(),
                              .grad_scale = scale_.view()};
    {
      const StepArenaScope scope(arena_);  // the micro-batch's tensors: the same blocks every step
      stage_loss(run, batches[m], 0.0, &grads, nullptr, &head);
    }
    fresh_ += arena_.fresh_blocks();
  }
  if (tail) tail(sums(), result());  // device work on persistent buffers: no arena block, no host read
}

FixedStep::~FixedStep() {
  // A step still running reads the graph's frozen uploads and writes the read slots. (A failed wait
  // is a device error already being reported, or about to be: not thrown from a destructor.)
  for (const InFlight& f : in_flight_) {
    try {
      readback_.wait(f.slot);
    } catch (...) {
    }
  }
}

void FixedStep::launch(const StageRun& stage, const std::vector<StageBatch>& batches, int64_t counted,
                       ModelTensors& grads, const Tail& tail) {
  HYDRA_ASSERT(batches.size() == ids_.size(), "a fixed step of {} micro-batches given {}", ids_.size(), batches.size());
  HYDRA_ASSERT(stage.timer == nullptr, "the fixed step is not timed by phase (a capture records no timing events)");
  HYDRA_ASSERT(counted > 0, "a fixed step that counts no target");
  HYDRA_ASSERT(in_flight_.size() < 2, "a third step launched before the first was collected (two read slots)");
  // 1. The inputs into the persistent buffers, queued before the work (host -> device, in stream
  // order: a step still running has read its own inputs before these land).
  Shape shape;
  std::vector<StageBatch> on_device;
  InFlight step;
  for (size_t m = 0; m < batches.size(); ++m) {
    const StageBatch& b = batches[m];
    HYDRA_ASSERT(b.layout.local_length() == rows_, "micro-batch {} of {} rows in a fixed step of {}", m,
                 b.layout.local_length(), rows_);
    copy_into(ids_[m], b.rows.ids);
    copy_into(targets_[m], b.rows.targets);
    Tensor marks = Tensor::zeros({rows_}, DType::i32, Device::host);
    for (size_t i = 0; i < b.rows.answer.size(); ++i) marks.data_as<int32_t>()[i] = b.rows.answer[i] ? 1 : 0;
    copy_into(answer_[m], marks);
    on_device.push_back(StageBatch{b.layout, TokenRows{ids_[m], targets_[m], {}}, b.counted});
    shape.push_back(b.layout.document_starts());
    step.counts.tokens += b.counted.tokens;
    step.counts.answer_tokens += b.counted.answer_tokens;
  }
  // The scale as the eager loop passes it to the loss kernel: float(1 / counted).
  scale_host_.data_as<float>()[0] = static_cast<float>(1.0 / static_cast<double>(counted));
  copy_into(scale_, scale_host_);
  // 2. The work: replayed, captured, or run (see fixed_step.h). A graph is replaced only once the
  // steps launched from it have finished (its exec and frozen uploads are freed).
  const auto drop_graph = [&] {
    for (const InFlight& f : in_flight_) readback_.wait(f.slot);  // the results stay for collect()
    graph_.reset();
    graph_ready_ = false;
  };
  // A graph holds the tail it was captured with: one captured without it is not replayed with one.
  if (graph_ready_ && graph_tail_ != static_cast<bool>(tail)) drop_graph();
  if (mode_ == StepMode::graph && graph_ready_ && shape == graph_shape_) {
    graph_.launch();
    step.graph = true;
    fresh_ = 0;
  } else if (mode_ == StepMode::graph && warm_ && shape == warm_shape_) {
    if (graph_.captured()) drop_graph();
    graph_.capture([&] { work(stage, on_device, grads, tail); });
    HYDRA_ASSERT(fresh_ == 0, "the captured training step allocated {} fresh blocks", fresh_);
    graph_shape_ = shape;
    graph_ready_ = true;
    graph_tail_ = static_cast<bool>(tail);
    graph_.launch();
    step.graph = true;
  } else {
    work(stage, on_device, grads, tail);
    warm_ = true;
    warm_shape_ = shape;
    if (fresh_ > 0 && graph_.captured()) drop_graph();  // blocks moved: a graph captured before reads stale addresses
  }
  step.fresh_blocks = fresh_;
  step.tail = static_cast<bool>(tail);
  // 3. The read of the sums and the tail's result, one copy queued behind the work (the update
  // included) into this step's slot; collect() waits for it.
  step.slot = next_slot_;
  next_slot_ = 1 - next_slot_;
  readback_.queue(step.slot, readout_.view());
  in_flight_.push_back(step);
}

FixedStep::Collected FixedStep::collect() {
  HYDRA_ASSERT(!in_flight_.empty(), "collect() without a launched step");
  const InFlight step = in_flight_.front();
  in_flight_.pop_front();
  const double* read = static_cast<const double*>(readback_.wait(step.slot));
  Collected c;
  c.sums.tokens = step.counts.tokens;
  c.sums.answer_tokens = step.counts.answer_tokens;
  for (int64_t m = 0; m < groups_; ++m) {
    c.sums.loss += read[2 * m];  // (0 + s_0) + s_1 + …: the eager loop's order
    c.sums.answer_loss += read[2 * m + 1];
  }
  for (size_t i = 0; i < c.tail_result.size(); ++i) {
    c.tail_result[i] = step.tail ? read[2 * groups_ + static_cast<int64_t>(i)] : 0.0;
  }
  c.graph = step.graph;
  c.fresh_blocks = step.fresh_blocks;
  return c;
}

FixedStep::Collected FixedStep::run(const StageRun& stage, const std::vector<StageBatch>& batches, int64_t counted,
                                    ModelTensors& grads, const Tail& tail) {
  HYDRA_ASSERT(in_flight_.empty(), "run() with {} step(s) launched and not collected", in_flight_.size());
  launch(stage, batches, counted, grads, tail);
  return collect();
}

}  // namespace hydra::train
