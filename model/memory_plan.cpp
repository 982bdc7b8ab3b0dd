#include "model/memory_plan.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "model/params.h"
#include "model/prefill.h"
#include "parallel/plan_world.h"
#include "runtime/error.h"
#include "runtime/host_memory.h"
#if HYDRA_CUDA
#include "runtime/cuda_memory.h"
#endif

namespace hydra {

void MemoryEstimate::add(MemoryPart p, double bytes) {
  activations += bytes;
  parts[static_cast<size_t>(p)] += bytes;
}

std::string MemoryEstimate::describe() const {
  const double g = 1024.0 * 1024.0 * 1024.0;
  std::string by_part;
  for (int i = 0; i < kMemoryPartCount; ++i) {
    if (parts[static_cast<size_t>(i)] <= 0) continue;
    by_part += fmt::format("{}{} {:.1f}", by_part.empty() ? ": " : ", ", memory_part_name(static_cast<MemoryPart>(i)),
                           parts[static_cast<size_t>(i)] / g);
  }
  return fmt::format("{:.1f} GiB (weights {:.1f}, build {:.1f}, peak {:.1f}{}{})", total() / g, weights / g,
                     init_extra / g, activations / g, by_part, peak_at.empty() ? "" : ", at " + peak_at);
}

PlanTypes plan_types(Device device, DType host_dtype) {
  if (device == Device::cuda) return {storage_dtype(device), DType::f32};
  return {host_dtype, host_dtype};
}

Model shape_only_model(const ModelConfig& config, Device device, DType dtype) {
  MemoryTimeline building(device);
  ShapeOnlyRun run(building);
  NamedTensors params;
  for (const ParamSpec& spec : parameter_specs(config)) params.emplace(spec.name, Tensor::empty(spec.shape, DType::f32));
  return Model(config, params, device, dtype);
}

ModelTensors shape_only_gradients(const Model& model) {
  MemoryTimeline building(model.device());
  ShapeOnlyRun run(building);
  return model.zeros_like_weights(model.acc_dtype());
}

MemoryEstimate plan_pass(Device device, int world, int64_t local_tokens, bool documents, const char* stage,
                         const std::function<void(ForwardContext& context)>& pass) {
  // Rank 0's rows: every rank of the zigzag layout holds the same shapes, and rank 0 also forms a
  // prefill's last logits.
  PlanWorld comm(world, 0, device);
  const SequenceLayout one = group_layout(comm, local_tokens * world);
  const SequenceLayout layout = documents ? one.with_document_bounds() : one;
  MemoryTimeline timeline(device);
  {
    ShapeOnlyRun run(timeline);
    timeline.set_stage(stage);
    ForwardContext context{comm, layout};
    pass(context);
  }
  MemoryEstimate m;
  m.activations = timeline.peak();
  m.parts = timeline.peak_parts();
  m.peak_at = timeline.peak_at();
  m.allocated = timeline.held_total();
  m.unnamed_buffers = timeline.unnamed();
  return m;
}

double runtime_tensor_bytes(const ModelConfig& c, Device device, DType dtype, DType acc,
                            std::optional<DType> tensors_dtype) {
  const DType gemm = tensors_dtype.value_or(dtype), other = tensors_dtype.value_or(acc);
  double total = 0;
  const auto add = [&](const BufferSpec& b) { total += allocated_bytes(device, b.bytes()); };
  add({{c.vocab_size, c.hidden_size}, gemm});  // the embedding
  if (!c.tie_word_embeddings) add({{c.vocab_size, c.hidden_size}, gemm});  // lm_head
  add({{c.hidden_size}, other});  // the final norm
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerLayout layout = layer_layout(c, l);
    for (int s = 0; s < kSlotCount; ++s) {
      const Slot slot = static_cast<Slot>(s);
      std::vector<int64_t> shape = layout.shape(slot, c);
      if (shape.empty()) continue;
      const bool is_gemm = slot == Slot::in_proj || slot == Slot::o_proj || slot == Slot::mlp_in || slot == Slot::mlp_down;
      add({std::move(shape), is_gemm ? gemm : other});
    }
  }
  return total;
}

MemoryEstimate estimate_prefill_memory(const ModelConfig& c, int64_t local_tokens, int world, Device device,
                                       bool documents) {
  const PlanTypes ty = plan_types(device);
  const Model model = shape_only_model(c, device, ty.dtype);
  MemoryEstimate m = plan_pass(device, world, local_tokens, documents, "prefill", [&](ForwardContext& context) {
    const Tensor ids = Tensor::empty({local_tokens}, DType::i32, Device::host, "token ids");
    prefill_last_logits(context, model, ids);
  });
  m.weights = runtime_tensor_bytes(c, device, ty.dtype, ty.acc);
  // The parameter set the runtime copies are built from: drawn in bf16 on the GPU (a preset) or read
  // on the host (a checkpoint); f32 on the host.
  m.init_extra = static_cast<double>(parameter_count(c)) * (device == Device::cuda ? 2.0 : 4.0);
  return m;
}

MemoryEstimate estimate_forward_memory(const ModelConfig& c, int64_t total_tokens, int64_t local_tokens, int world,
                                       int rank, Device device, bool logits_out, bool documents) {
  MemoryEstimate m = estimate_prefill_memory(c, local_tokens, world, device, documents);
  // On the GPU path the device holds the logits; their host copy and the rest: forward_host_bytes.
  m.add(MemoryPart::outputs, device == Device::host
                                 ? forward_host_bytes(c, total_tokens, local_tokens, rank, logits_out)
                                 : forward_logits_bytes(c, local_tokens, logits_out));
  return m;
}

double forward_logits_bytes(const ModelConfig& c, int64_t local_tokens, bool logits_out) {
  return logits_out ? static_cast<double>(local_tokens) * static_cast<double>(c.vocab_size) *
                          static_cast<double>(dtype_size(DType::f32))
                    : 0.0;
}

double forward_host_bytes(const ModelConfig& c, int64_t total_tokens, int64_t local_tokens, int rank, bool logits_out) {
  const double logits = forward_logits_bytes(c, local_tokens, logits_out);
  // Rank 0 assembles [T, V] and receives one rank's block at a time; every rank reads all ids [T] i32.
  const double assembly = logits_out && rank == 0 ? logits + forward_logits_bytes(c, total_tokens, true) : 0.0;
  return logits + assembly + static_cast<double>(total_tokens) * static_cast<double>(dtype_size(DType::i32));
}

namespace {
struct Available {
  double bytes = 0;
  std::string where;
};
Available available_memory(Device device, int ranks_on_host) {
  Available out;
#if HYDRA_CUDA
  if (device == Device::cuda) {
    // Ranks sharing a GPU (HYDRA_SHARE_GPUS=1, parallel/device_world.h) each hold a whole copy of
    // what one rank holds: the free memory is split among as many as the most crowded GPU has.
    const int gpus = std::max(1, cuda_device_count());
    const int sharing = (std::max(1, ranks_on_host) + gpus - 1) / gpus;
    out.bytes = static_cast<double>(cuda_memory_stats().free_device) / sharing;
    out.where = sharing > 1 ? fmt::format("each of the {} ranks sharing the GPU", sharing) : std::string("the GPU");
  }
#endif
  if (device == Device::host) {
    out.bytes = host_available_bytes() / std::max(1, ranks_on_host);
    out.where = ranks_on_host > 1 ? fmt::format("each of this host's {} ranks", ranks_on_host) : std::string("this host");
  }
  return out;
}
}  // namespace

bool fits_in(const MemoryEstimate& estimate, double bytes) { return estimate.total() < 0.95 * bytes; }

bool fits_memory_plan(const MemoryEstimate& estimate, Device device, int ranks_on_host) {
  return fits_in(estimate, available_memory(device, ranks_on_host).bytes);
}

void check_memory_plan(const MemoryEstimate& estimate, Device device, const std::string& what, int ranks_on_host,
                       const std::string& remedy) {
  const double g = 1024.0 * 1024.0 * 1024.0;
  const Available available = available_memory(device, ranks_on_host);
  HYDRA_USER_CHECK(fits_in(estimate, available.bytes), "{} needs about {} per rank, but {} has {:.1f} GiB "
                   "available; {}", what, estimate.describe(), available.where, available.bytes / g, remedy);
}

}  // namespace hydra
