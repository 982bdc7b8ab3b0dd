#include "model/decode_engine.h"

#include <algorithm>

#include "kernels/argmax/argmax.h"
#include "runtime/programmatic_launch.h"

namespace hydra {

std::string_view decode_graph_name(DecodeGraph mode) {
  switch (mode) {
    case DecodeGraph::off: return "off";
    case DecodeGraph::on: return "on";
    case DecodeGraph::automatic: return "auto";
  }
  return "?";
}

DecodeGraph parse_decode_graph(std::string_view name) {
  for (const DecodeGraph mode : {DecodeGraph::off, DecodeGraph::on, DecodeGraph::automatic}) {
    if (name == decode_graph_name(mode)) return mode;
  }
  HYDRA_USER_FAIL("--cuda-graph must be on, off or auto (got '{}')", name);
}

bool decode_graph_possible(Device device) { return device == Device::cuda; }

bool decode_graph_wanted(DecodeGraph mode, Device device, int ranks) {
  return mode == DecodeGraph::on || (mode == DecodeGraph::automatic && decode_graph_possible(device) && ranks == 1);
}

DecodeEngineBuffers decode_engine_buffers(const ModelConfig& config, int64_t slots, bool host_logits) {
  DecodeEngineBuffers b{.ids = {{slots}, DType::i32}, .logits = {{slots, config.vocab_size}, DType::f32},
                        .best = {{slots}, DType::i32}, .host_logits = {}};
  if (host_logits) b.host_logits = b.logits;
  return b;
}

double DecodeEngineBuffers::bytes(Device device) const {
  const double copies = device == Device::host ? 1.0 : 2.0;  // ids and best: a device buffer and its host staging
  return copies * (ids.bytes() + best.bytes()) + logits.bytes() + (host_logits.exists() ? host_logits.bytes() : 0.0);
}

DecodeEngine::DecodeEngine(Communicator& comm, const Model& model, KvCache& cache, DecodeEngineOptions options)
    : comm_(comm), model_(model), cache_(cache), options_(options) {
  const Device device = model.device();
  HYDRA_ASSERT(!options.cuda_graph || decode_graph_possible(device), "a CUDA graph of the decode step needs the GPU (device {})",
               device_name(device));
  const DecodeEngineBuffers spec = decode_engine_buffers(model.config(), cache.slots(), options.host_logits);
  ids_ = spec.ids.zeros(device);
  ids_host_ = spec.ids.zeros(Device::host);
  logits_ = spec.logits.empty(device);
  best_ = spec.best.empty(device);
  best_host_ = spec.best.zeros(Device::host);
  if (spec.host_logits.exists()) logits_host_ = spec.host_logits.zeros(Device::host);
  // Fixed attention launch shapes wherever a graph is possible, graph or not: eager steps there are
  // the graph's kernels, so switching the graph off changes no bit.
  cache_.set_whole_capacity(decode_graph_possible(device));
}

void DecodeEngine::run(int64_t batch, StepResult result) const {
  ForwardContext context{.comm = comm_, .cache = &cache_};
  const Tensor hidden = model_.decode_step(context, ids_.view().narrow(0, 0, batch));
  if (result == StepResult::none) return;
  const TensorView logits = logits_.view().narrow(0, 0, batch);
  model_.lm_head(logits, hidden);
  ops::row_argmax(best_.view().narrow(0, 0, batch), logits);
}

void DecodeEngine::step(std::span<const int64_t> slots, std::span<const int32_t> ids, StepResult result) {
  const int64_t batch = static_cast<int64_t>(slots.size());
  HYDRA_ASSERT(batch >= 1 && ids.size() == slots.size() && batch <= cache_.slots(),
               "a decode step of {} slots and {} ids (at most {})", slots.size(), ids.size(), cache_.slots());
  HYDRA_ASSERT(result != StepResult::logits || options_.host_logits, "step logits asked of an engine without host_logits");
  batch_ = batch;
  graph_launched_ = false;
  std::copy(ids.begin(), ids.end(), ids_host_.data_as<int32_t>());
  copy_into(ids_.view().narrow(0, 0, batch), ids_host_.view().narrow(0, 0, batch));
  {
    StepArenaScope scope(arena_);
    // HYDRA_DECODE_PDL: the step's kernels with programmatic dependent launch, eager or captured
    // (a captured launch keeps the attribute in its graph node).
    ProgrammaticLaunchScope pdl(model_.kernel_options().decode_pdl && model_.device() == Device::cuda);
    cache_.begin_decode(slots);  // its positions tensor is the arena's first block
    if (!options_.cuda_graph) {
      run(batch, result);
    } else {
      // The graph always computes the arg-max (fixed work); a batch size runs eagerly once first.
      const StepResult fixed = StepResult::argmax;
      if (graph_batch_ == batch) {
        graph_.launch();
        graph_launched_ = true;
      } else if (warm_batch_ == batch) {
        graph_.capture([&] { run(batch, fixed); });
        HYDRA_ASSERT(arena_.fresh_blocks() == 0, "the captured decode step allocated {} blocks", arena_.fresh_blocks());
        graph_batch_ = batch;
        graph_.launch();
        graph_launched_ = true;
      } else {
        run(batch, fixed);
        warm_batch_ = batch;
        if (arena_.fresh_blocks() > 0) {  // blocks moved: a graph captured before reads stale addresses
          graph_.reset();
          graph_batch_ = 0;
        }
      }
    }
  }
  cache_.end_decode();
  // Results to the host (a device-to-host copy: the step's end).
  if (result == StepResult::argmax) {
    copy_into(best_host_.view().narrow(0, 0, batch), best_.view().narrow(0, 0, batch));
  } else if (result == StepResult::logits) {
    copy_into(logits_host_.view().narrow(0, 0, batch), logits_.view().narrow(0, 0, batch));
  }
}

std::span<const int32_t> DecodeEngine::argmax() const {
  return {best_host_.data_as<int32_t>(), static_cast<size_t>(batch_)};
}

std::span<const float> DecodeEngine::logits() const {
  return {logits_host_.data_as<float>(), static_cast<size_t>(batch_ * model_.config().vocab_size)};
}

}  // namespace hydra
