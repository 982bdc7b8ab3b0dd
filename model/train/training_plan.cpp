#include "model/train/training_plan.h"

#include <algorithm>
#include <optional>

#include "model/params.h"
#include "model/train/objective.h"
#include "runtime/error.h"

namespace hydra {

double optimizer_bytes(const ModelConfig& c, Device device, DType host_dtype, int optimizer_shards) {
  const PlanTypes ty = plan_types(device, host_dtype);
  // Gradients in acc, every parameter, on every rank (each accumulates its tokens' contributions).
  const double whole = runtime_tensor_bytes(c, device, ty.dtype, ty.acc, ty.acc);
  if (optimizer_shards <= 1) return 4 * whole;  // masters and both moments too
  // ZeRO-1 (model/train/optimizer.cpp): this rank's ⌈N/W⌉ of the flat masters and both moments,
  // and the buckets a step allocates (W·b send + b receive within the largest tensor and 32M elements).
  const int64_t n = parameter_count(c), w = optimizer_shards;
  int64_t largest = c.vocab_size * c.hidden_size;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerLayout layout = layer_layout(c, l);
    for (int s = 0; s < kSlotCount; ++s) {
      int64_t count = 1;
      for (const int64_t d : layout.shape(static_cast<Slot>(s), c)) count *= d;
      largest = std::max(largest, count);
    }
  }
  const int64_t stride = (n + w - 1) / w;
  const int64_t bucket = std::clamp<int64_t>(std::min<int64_t>(largest, int64_t{1} << 25) / (w + 1), 1, stride);
  const double shard = allocated_bytes(device, BufferSpec{{stride}, ty.acc}.bytes());  // masters, m, v: one each
  const double sent = allocated_bytes(device, BufferSpec{{w * bucket}, ty.acc}.bytes());
  const double received = allocated_bytes(device, BufferSpec{{bucket}, ty.acc}.bytes());
  return whole + 3 * shard + sent + received;
}

MemoryEstimate estimate_training_memory(const ModelConfig& c, int64_t local_tokens, int ranks_per_sequence,
                                        const ModelConfig* teacher, Device device, bool align, KeptActivations keep,
                                        bool documents, DType host_dtype, int optimizer_shards) {
  HYDRA_ASSERT(!align || teacher, "an alignment plan without a teacher");
  const PlanTypes ty = plan_types(device, host_dtype);
  const int64_t t = local_tokens;
  const Model model = shape_only_model(c, device, ty.dtype);
  ModelTensors grads = shape_only_gradients(model);
  std::optional<Model> teacher_model;
  if (teacher) teacher_model.emplace(shape_only_model(*teacher, device, ty.dtype));
  MemoryEstimate m = plan_pass(device, ranks_per_sequence, t, documents, "", [&](ForwardContext& context) {
    context.keep = keep;
    // The step's rows, as the trainer hands them over (host int32).
    const TokenRows rows{Tensor::empty({t}, DType::i32, Device::host, "token ids"),
                         Tensor::empty({t}, DType::i32, Device::host, "targets"), {}};
    if (align) {
      train::alignment_gradients(context, model, *teacher_model, rows.ids, 1.0, &grads);
    } else {
      train::sequence_gradients(context, model, rows,
                                teacher ? train::Objective::distillation : train::Objective::cross_entropy, 1.0, &grads,
                                teacher ? &*teacher_model : nullptr);
    }
  });
  // Weights in the storage type; gradients, masters and moments (AdamW) in acc.
  const double optimizer = optimizer_bytes(c, device, host_dtype, optimizer_shards);
  m.optimizer = optimizer;
  m.weights = runtime_tensor_bytes(c, device, ty.dtype, ty.acc) + optimizer +
              (teacher ? runtime_tensor_bytes(*teacher, device, ty.dtype, ty.acc) : 0.0);
  m.init_extra = std::max(0.0, static_cast<double>(parameter_count(c)) * (device == Device::cuda ? 2.0 : 4.0) -
                                   optimizer);  // built before the optimizer's state exists
  return m;
}

KeptPolicy parse_kept_policy(const std::string& name) {
  if (name == "none") return KeptPolicy::none;
  if (name == "gdn") return KeptPolicy::gdn;
  if (name == "gdn+proj") return KeptPolicy::gdn_proj;
  if (name == "gdn+proj+mlp") return KeptPolicy::gdn_proj_mlp;
  if (name == "auto") return KeptPolicy::most_that_fits;
  HYDRA_USER_FAIL("--kept-activations must be none, gdn, gdn+proj, gdn+proj+mlp or auto (got '{}')", name);
}

KeptActivations choose_kept_activations(KeptPolicy policy, int64_t layers,
                                        const std::function<MemoryEstimate(const KeptActivations&)>& plan,
                                        Device device, int ranks_on_host, Communicator& comm) {
  const KeptActivations gdn{.gdn_outputs = true}, gdn_proj{.gdn_outputs = true, .projection = true};
  switch (policy) {
    case KeptPolicy::none: return {};
    case KeptPolicy::gdn: return gdn;
    case KeptPolicy::gdn_proj: return gdn_proj;
    case KeptPolicy::gdn_proj_mlp: return {.gdn_outputs = true, .projection = true, .mlp_layers = layers};
    case KeptPolicy::most_that_fits: break;
  }
  std::vector<KeptActivations> candidates;  // most kept first
  for (int64_t n = layers; n >= 1; --n) candidates.push_back({.gdn_outputs = true, .projection = true, .mlp_layers = n});
  candidates.push_back(gdn_proj);
  candidates.push_back(gdn);
  candidates.push_back({});
  Tensor misfits = Tensor::empty({static_cast<int64_t>(candidates.size())}, DType::f64);
  for (size_t i = 0; i < candidates.size(); ++i) {
    misfits.data_as<double>()[i] = fits_memory_plan(plan(candidates[i]), device, ranks_on_host) ? 0.0 : 1.0;
  }
  all_reduce_sum_host(comm, misfits);  // every rank sees every rank's misfits: all choose the same
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (misfits.data_as<double>()[i] == 0.0) return candidates[i];
  }
  return candidates.back();
}

}  // namespace hydra
