#include "model/model.h"
#include "model/nonfinite.h"

#include <nlohmann/json.hpp>

#include "model/params.h"

namespace hydra {
namespace {

const Tensor& param(const NamedTensors& params, const std::string& name) {
  const auto it = params.find(name);
  HYDRA_ASSERT(it != params.end(), "parameter '{}' missing", name);
  return it->second;
}

// The copy a piece describes, between a checkpoint tensor and a runtime tensor of the same dtype
// and device (either direction).
void copy_piece(const Piece& piece, const TensorView& runtime, const TensorView& checkpoint, bool to_runtime) {
  const TensorView r = runtime.narrow(piece.dim, piece.dst_begin, piece.length);
  const TensorView c = checkpoint.narrow(piece.dim, piece.src_begin, piece.length);
  if (to_runtime) {
    copy_into(r, c);
  } else {
    copy_into(c, r);
  }
}

}  // namespace

Tensor& LayerWeights::slot(Slot s) {
  switch (s) {
    case Slot::input_norm: return input_norm;
    case Slot::in_proj: return in_proj;
    case Slot::q_norm: return q_norm;
    case Slot::k_norm: return k_norm;
    case Slot::conv: return conv;
    case Slot::a_log: return a_log;
    case Slot::dt_bias: return dt_bias;
    case Slot::fuse_norm: return fuse_norm;
    case Slot::fuse_gamma: return fuse_gamma;
    case Slot::o_proj: return o_proj;
    case Slot::post_norm: return post_norm;
    case Slot::mlp_in: return mlp_in;
    case Slot::mlp_down: return mlp_down;
    case Slot::fuse_gate_bias: return fuse_gate_bias;
  }
  HYDRA_ASSERT(false, "unknown slot {}", static_cast<int>(s));
  return input_norm;
}

const Tensor& LayerWeights::slot(Slot s) const { return const_cast<LayerWeights*>(this)->slot(s); }

void ModelTensors::for_each(const std::function<void(const std::string&, Tensor&)>& visit) {
  if (embed.defined()) visit("embed", embed);
  if (final_norm.defined()) visit("final_norm", final_norm);
  if (!tied && lm_head.defined()) visit("lm_head", lm_head);
  for (size_t l = 0; l < layers.size(); ++l) {
    for (int s = 0; s < kSlotCount; ++s) {
      Tensor& t = layers[l].slot(static_cast<Slot>(s));
      if (t.defined()) visit(runtime_name(static_cast<int64_t>(l), static_cast<Slot>(s)), t);
    }
  }
}

void ModelTensors::for_each(const std::function<void(const std::string&, const Tensor&)>& visit) const {
  const_cast<ModelTensors*>(this)->for_each([&](const std::string& name, Tensor& t) { visit(name, t); });
}

DType Model::place_dtype(Slot slot) const {
  const bool gemm = slot == Slot::in_proj || slot == Slot::o_proj || slot == Slot::mlp_in || slot == Slot::mlp_down;
  return gemm ? dtype_ : acc_dtype();
}

Model::Model(ModelConfig config, const NamedTensors& params, Device device, DType dtype)
    : config_(std::move(config)), device_(device), dtype_(dtype) {
  config_.validate();
  validate_parameters(config_, params, "model parameters");
  HYDRA_ASSERT(device == Device::cuda || dtype == DType::f32 || dtype == DType::f64,
               "the CPU path runs in float32 (float64 for gradient checks), not {}", dtype_name(dtype));
  for (int64_t l = 0; l < config_.num_layers; ++l) layouts_.push_back(layer_layout(config_, l));
  // Packed where the parameters are (host, or the GPU for weights drawn there), then placed.
  const Tensor& embed = param(params, "model.embed_tokens.weight");
  weights_.tied = config_.tie_word_embeddings;
  weights_.embed = to(embed, device, dtype);
  weights_.final_norm = to(param(params, "model.norm.weight"), device, acc_dtype());
  weights_.lm_head = weights_.tied ? weights_.embed : to(param(params, "lm_head.weight"), device, dtype);
  weights_.layers.resize(layouts_.size());
  for (const LayerLayout& layout : layouts_) {
    LayerWeights& w = weights_.layers[static_cast<size_t>(layout.layer)];
    for (int s = 0; s < kSlotCount; ++s) {
      const Slot slot = static_cast<Slot>(s);
      const std::vector<int64_t> shape = layout.shape(slot, config_);
      if (shape.empty()) continue;
      Tensor staged = Tensor::zeros(shape, embed.dtype(), embed.device());  // zero: the projection's padding rows
      for (const Piece& piece : layout.pieces) {
        if (piece.slot == slot) copy_piece(piece, staged, param(params, piece.name), true);
      }
      w.slot(slot) = to(staged, device, place_dtype(slot));
    }
    w.head_of = layout.head_of;
    w.fa_kv_of = layout.fa_kv_of;
    w.h_fa = layout.h_fa;
    w.g_fa = layout.g_fa;
    w.h_gdn = layout.h_gdn;
  }
}

ModelTensors Model::zeros_like_weights(DType dtype, const std::function<bool(const std::string&)>& keep) const {
  auto kept = [&](const std::string& name) { return !keep || keep(name); };
  ModelTensors out;
  out.tied = weights_.tied;
  if (kept("model.embed_tokens.weight") || (weights_.tied && kept("lm_head.weight"))) {
    out.embed = Tensor::zeros(weights_.embed.shape(), dtype, device_);
  }
  if (kept("model.norm.weight")) out.final_norm = Tensor::zeros(weights_.final_norm.shape(), dtype, device_);
  if (weights_.tied) {
    out.lm_head = out.embed;
  } else if (kept("lm_head.weight")) {
    out.lm_head = Tensor::zeros(weights_.lm_head.shape(), dtype, device_);
  }
  out.layers.resize(weights_.layers.size());
  for (const LayerLayout& layout : layouts_) {
    const LayerWeights& w = weights_.layers[static_cast<size_t>(layout.layer)];
    LayerWeights& g = out.layers[static_cast<size_t>(layout.layer)];
    for (const Piece& piece : layout.pieces) {
      Tensor& t = g.slot(piece.slot);
      if (!t.defined() && kept(piece.name)) t = Tensor::zeros(w.slot(piece.slot).shape(), dtype, device_);
    }
    g.head_of = w.head_of;
    g.fa_kv_of = w.fa_kv_of;
    g.h_fa = w.h_fa;
    g.g_fa = w.g_fa;
    g.h_gdn = w.h_gdn;
  }
  return out;
}

NamedTensors Model::unpack(const ModelTensors& tensors) const {
  NamedTensors out;
  // Host f32, or f64 for the tensors of a host f64 model (gradient checks keep their precision).
  auto host = [](const Tensor& t) { return to(t, Device::host, t.dtype() == DType::f64 ? DType::f64 : DType::f32); };
  if (tensors.embed.defined()) out.emplace("model.embed_tokens.weight", host(tensors.embed));
  if (tensors.final_norm.defined()) out.emplace("model.norm.weight", host(tensors.final_norm));
  if (!tensors.tied && tensors.lm_head.defined()) out.emplace("lm_head.weight", host(tensors.lm_head));
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const ParamSpec& spec : parameter_specs(config_)) shapes[spec.name] = spec.shape;
  for (const LayerLayout& layout : layouts_) {
    const LayerWeights& w = tensors.layers.at(static_cast<size_t>(layout.layer));
    std::map<Slot, Tensor> staged;
    for (const Piece& piece : layout.pieces) {
      const Tensor& t = w.slot(piece.slot);
      if (!t.defined()) continue;
      auto it = staged.find(piece.slot);
      if (it == staged.end()) it = staged.emplace(piece.slot, host(t)).first;
      auto [named, fresh] = out.try_emplace(piece.name);
      if (fresh) named->second = Tensor::zeros(shapes.at(piece.name), it->second.dtype());
      copy_piece(piece, it->second, named->second, false);
    }
  }
  return out;
}

void Model::pack(const NamedTensors& params, ModelTensors& out) const {
  auto place = [&](Tensor& dst, const char* name) {
    if (dst.defined()) copy_into(dst, to(param(params, name), dst.device(), dst.dtype()));
  };
  place(out.embed, "model.embed_tokens.weight");
  place(out.final_norm, "model.norm.weight");
  if (!out.tied) place(out.lm_head, "lm_head.weight");
  for (const LayerLayout& layout : layouts_) {
    LayerWeights& w = out.layers.at(static_cast<size_t>(layout.layer));
    for (int s = 0; s < kSlotCount; ++s) {
      Tensor& dst = w.slot(static_cast<Slot>(s));
      if (!dst.defined()) continue;
      Tensor staged = Tensor::zeros(dst.shape(), DType::f32);
      for (const Piece& piece : layout.pieces) {
        if (piece.slot == static_cast<Slot>(s)) copy_piece(piece, staged, param(params, piece.name), true);
      }
      copy_into(dst, to(staged, dst.device(), dst.dtype()));
    }
  }
}

namespace {
ModelConfig config_of(const CheckpointReader& reader, const std::string& path) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(reader.config_json());
  } catch (const nlohmann::json::exception& e) {
    HYDRA_USER_FAIL("{}: the 'config' attribute is not JSON ({})", path, e.what());
  }
  return config_from_json(json, path);
}
}  // namespace

ModelConfig read_model_config(const std::string& path) { return config_of(CheckpointReader(path), path); }

LoadedCheckpoint read_model_checkpoint(const std::string& path, NonFinite nonfinite) {
  CheckpointReader reader(path);
  LoadedCheckpoint out;
  out.config = config_of(reader, path);
  for (const ParamSpec& spec : parameter_specs(out.config)) {
    HYDRA_USER_CHECK(reader.contains(spec.name), "{}: tensor '{}' is missing", path, spec.name);
    const DatasetInfo info = reader.info(spec.name);
    HYDRA_USER_CHECK(info.dtype == DType::f32 || info.dtype == DType::bf16,
                     "{}: tensor '{}' is {}, expected float32 or bfloat16", path, spec.name, dtype_name(info.dtype));
    HYDRA_USER_CHECK(info.shape == spec.shape, "{}: tensor '{}' has shape {}, the config needs {}", path, spec.name,
                     format_shape(info.shape), format_shape(spec.shape));
    out.params.emplace(spec.name, reader.read(spec.name, DType::f32));
  }
  validate_parameters(out.config, out.params, path);
  if (nonfinite == NonFinite::refuse) check_finite_parameters(out.params, path);
  for (const std::string& name : reader.names()) {
    HYDRA_USER_CHECK(out.params.count(name), "{}: unexpected tensor '{}' for this config", path, name);
  }
  return out;
}

void write_model_checkpoint(const std::string& path, const ModelConfig& config, const NamedTensors& params) {
  validate_parameters(config, params, path);
  write_checkpoint(path, config_to_json(config).dump(), params);
}

Model Model::load(const std::string& path, Device device, DType dtype, NonFinite nonfinite) {
  LoadedCheckpoint ck = read_model_checkpoint(path, nonfinite);
  return Model(std::move(ck.config), ck.params, device, dtype);
}

}  // namespace hydra
