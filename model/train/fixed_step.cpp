// The fixed step (fixed_step.h): persistent inputs, the step arena, the loss sums on the device, and
// the CUDA graph of the micro-batches' work.
#include "model/train/fixed_step.h"

#include <string>

#include "runtime/error.h"

namespace hydra::train {

FixedStep::FixedStep(StepMode mode, const Model& model, int64_t micro_batches, int64_t rows)
    : mode_(mode), device_(model.device()), rows_(rows) {
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
  sums_ = Tensor::zeros({micro_batches, 2}, DType::f64, device_, "step loss sums");
  scale_ = Tensor::zeros({1}, DType::f32, device_, "step gradient scale");
  scale_host_ = Tensor::zeros({1}, DType::f32, Device::host);
}

void FixedStep::work(const StageRun& run, const std::vector<StageBatch>& batches, ModelTensors& grads) {
  copy_into(sums_, zero_sums_);  // a device copy: a node of the graph, not a host write
  fresh_ = 0;
  for (size_t m = 0; m < batches.size(); ++m) {
    const DeviceLossHead head{.sums = sums_.view().select(0, static_cast<int64_t>(m)), .answer = answer_[m].view(),
                              .grad_scale = scale_.view()};
    {
      const StepArenaScope scope(arena_);  // the micro-batch's tensors: the same blocks every step
      stage_loss(run, batches[m], 0.0, &grads, nullptr, &head);
    }
    fresh_ += arena_.fresh_blocks();
  }
}

LossSums FixedStep::run(const StageRun& stage, const std::vector<StageBatch>& batches, int64_t counted,
                        ModelTensors& grads) {
  HYDRA_ASSERT(batches.size() == ids_.size(), "a fixed step of {} micro-batches given {}", ids_.size(), batches.size());
  HYDRA_ASSERT(stage.timer == nullptr, "the fixed step is not timed by phase (a capture records no timing events)");
  HYDRA_ASSERT(counted > 0, "a fixed step that counts no target");
  // 1. The inputs into the persistent buffers, queued before the work (host -> device, in stream order).
  Shape shape;
  std::vector<StageBatch> on_device;
  LossSums total;
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
    total.tokens += b.counted.tokens;
    total.answer_tokens += b.counted.answer_tokens;
  }
  // The scale as the eager loop passes it to the loss kernel: float(1 / counted).
  scale_host_.data_as<float>()[0] = static_cast<float>(1.0 / static_cast<double>(counted));
  copy_into(scale_, scale_host_);
  // 2. The work: replayed, captured, or run (see fixed_step.h).
  launched_ = false;
  if (mode_ == StepMode::graph && graph_ready_ && shape == graph_shape_) {
    graph_.launch();
    launched_ = true;
    fresh_ = 0;
  } else if (mode_ == StepMode::graph && warm_ && shape == warm_shape_) {
    graph_.capture([&] { work(stage, on_device, grads); });
    HYDRA_ASSERT(fresh_ == 0, "the captured training step allocated {} fresh blocks", fresh_);
    graph_shape_ = shape;
    graph_ready_ = true;
    graph_.launch();
    launched_ = true;
  } else {
    work(stage, on_device, grads);
    warm_ = true;
    warm_shape_ = shape;
    if (fresh_ > 0) {  // blocks moved: a graph captured before reads stale addresses
      graph_.reset();
      graph_ready_ = false;
    }
  }
  // 3. The sums, read once (a device-to-host copy: waits for the work) and added in micro-batch order.
  const Tensor sums = to(sums_, Device::host, DType::f64);
  for (size_t m = 0; m < batches.size(); ++m) {
    LossSums s;
    s.loss = sums.data_as<double>()[2 * m];
    s.answer_loss = sums.data_as<double>()[2 * m + 1];
    total.loss += s.loss;  // (0 + s_0) + s_1 + …: the eager loop's order
    total.answer_loss += s.answer_loss;
  }
  return total;
}

}  // namespace hydra::train
