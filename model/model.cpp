#include "model/model.h"
#include "model/nonfinite.h"

#include <cmath>
#include <numeric>

#include <nlohmann/json.hpp>

#include "kernels/elementwise/elementwise.h"
#include "kernels/embedding/embedding.h"
#include "kernels/fusion/fusion.h"
#include "kernels/gdn_gates/gdn_gates.h"
#include "kernels/matmul/matmul.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/swiglu/swiglu.h"
#include "model/params.h"
#include "parallel/gdn_scan.h"
#include "parallel/ring_attention.h"
#include "runtime/concurrency.h"
#include "runtime/fault.h"

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

Tensor Model::positions(const SequenceLayout& layout) const {
  const std::vector<int64_t> pos = layout.local_positions();
  return to_device(TensorView(const_cast<int64_t*>(pos.data()), DType::i64, Device::host,
                              {static_cast<int64_t>(pos.size())}),
                   device_);
}

Tensor Model::embed(const TensorView& ids) const {
  Tensor x = Tensor::empty({ids.size(0), config_.hidden_size}, dtype_, device_);
  ops::embedding(x, weights_.embed, to_device(ids, device_));
  return x;
}

Tensor Model::final_norm(const TensorView& x) const {
  Tensor out = Tensor::empty(x.shape(), dtype_, device_);
  ops::rms_norm(out, x, weights_.final_norm, {static_cast<float>(config_.rms_norm_eps)});
  return out;
}

Tensor Model::forward(ForwardContext& context, const TensorView& ids) const {
  const Tensor x = forward_residual(context, ids);
  ScopedPhase phase(context.timer, Phase::other);
  return final_norm(x);
}

Tensor Model::forward_residual(ForwardContext& context, const TensorView& ids) const {
  const SequenceLayout& layout = context.layout;
  expect_shape(ids, "token ids", {{"T_loc", layout.local_length()}});
  HYDRA_ASSERT(context.comm.size() == layout.world_size() && context.comm.rank() == layout.rank(),
               "layout for rank {}/{} used on rank {}/{}", layout.rank(), layout.world_size(), context.comm.rank(),
               context.comm.size());
  const Tensor pos = positions(layout);
  Tensor x;  // the residual stream
  {
    ScopedPhase phase(context.timer, Phase::other);
    x = embed(ids);
  }
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    layer_forward(context, l, pos, x);
    if (context.after_layer) context.after_layer(l);
  }
  return x;
}

void Model::layer_forward(ForwardContext& context, int64_t layer, const Tensor& positions, const TensorView& x,
                          LayerSaved* saved) const {
  const LayerWeights& w = layers_at(layer);
  expect_shape(x, "residual stream", {{"T_loc", context.layout.local_length()}, {"D", config_.hidden_size}});
  HYDRA_ASSERT(!(saved && context.observer), "a forward that saves for the backward cannot be observed (patched)");
  maybe_inject_fault("layer");
  if (saved) saved->input = clone(x);
  Tensor x_norm = Tensor::empty(x.shape(), dtype_, device_);
  {
    ScopedPhase phase(context.timer, Phase::other);
    ops::rms_norm(x_norm, x, w.input_norm, {static_cast<float>(config_.rms_norm_eps)});
  }
  if (config_.is_hydra()) {
    attention_hydra(context, layer, positions, x_norm, x, saved);
  } else {
    attention_teacher(context, layer, positions, x_norm, x, saved);
  }
  Tensor gate_up;
  if (saved && layer < context.keep.mlp_layers) {
    gate_up = Tensor::empty({x.size(0), 2 * config_.intermediate_size}, dtype_, device_);
    saved->mlp_gate_up = gate_up;
  }
  mlp(context, layer, x, gate_up);
}

void Model::attention_teacher(ForwardContext& context, int64_t layer, const Tensor& positions,
                              const TensorView& x_norm, const TensorView& x, LayerSaved* saved) const {
  const LayerWeights& w = layers_at(layer);
  const ProjectionColumns& col = layout(layer).columns;
  const int64_t t = x.size(0), H = config_.num_heads, G = config_.num_kv_heads, d = config_.head_dim;
  PhaseTimer* timer = context.timer;
  Tensor proj = Tensor::empty({t, w.in_proj.size(0)}, dtype_, device_);
  {
    ScopedPhase phase(timer, Phase::gemm);
    ops::linear(proj, x_norm, w.in_proj);
  }
  const TensorView q = proj.view().narrow(1, col.fa_q, H * d).split_dim(1, H, d);  // [T, H, d]
  const TensorView k = proj.view().narrow(1, col.fa_k, G * d).split_dim(1, G, d);  // [T, G, d]
  const TensorView v = proj.view().narrow(1, col.fa_v, G * d).split_dim(1, G, d);
  const ops::RmsNormParams norm{static_cast<float>(config_.rms_norm_eps)};
  {
    ScopedPhase phase(timer, Phase::other);
    ops::rms_norm(q, q, w.q_norm, norm);
    ops::rms_norm(k, k, w.k_norm, norm);
    ops::rope(q, positions, {config_.rope_theta});
    ops::rope(k, positions, {config_.rope_theta});
  }
  Tensor o_acc = Tensor::empty({t, H, d}, acc_dtype(), device_), lse = Tensor::empty({H, t}, acc_dtype(), device_);
  ring_attention(context.comm, context.layout, o_acc, lse, q, k, v, ops::AttentionParams{.kv_head_of_query = w.fa_kv_of},
                 timer);
  Tensor o;
  {
    ScopedPhase phase(timer, Phase::other);
    o = to(o_acc, device_, dtype_);
  }
  if (saved) {
    saved->fa_out = o;
    saved->fa_lse = lse;
  }
  if (context.observer) context.observer->on_head_outputs(layer, o, w.head_of);
  ScopedPhase phase(timer, Phase::gemm);
  ops::linear(x, o.view().reshape({t, H * d}), w.o_proj, ops::Accumulate::yes);
}

void Model::attention_hydra(ForwardContext& context, int64_t layer, const Tensor& positions,
                            const TensorView& x_norm, const TensorView& x, LayerSaved* saved) const {
  const LayerWeights& w = layers_at(layer);
  const ProjectionColumns& col = layout(layer).columns;
  const int64_t t = x.size(0), H = config_.num_heads, d = config_.head_dim;
  const int64_t hfa = w.h_fa, gfa = w.g_fa, hg = w.h_gdn;
  PhaseTimer* timer = context.timer;
  Tensor proj = Tensor::empty({t, w.in_proj.size(0)}, dtype_, device_);  // read-only below (it may be kept)
  {
    ScopedPhase phase(timer, Phase::gemm);
    ops::linear(proj, x_norm, w.in_proj);
  }
  if (saved && context.keep.projection) saved->proj = proj;
  Tensor heads = Tensor::empty({t, H, d}, dtype_, device_);  // physical order: FA heads, then GDN heads
  const ops::RmsNormParams norm{static_cast<float>(config_.rms_norm_eps)};
  const TensorView pv = proj.view();
  auto fa_branch = [&] {
    const TensorView v = pv.narrow(1, col.fa_v, gfa * d).split_dim(1, gfa, d);
    const TensorView gate = pv.narrow(1, col.fa_gate, hfa * d);
    Tensor q = Tensor::empty({t, hfa, d}, dtype_, device_), k = Tensor::empty({t, gfa, d}, dtype_, device_);
    {
      ScopedPhase phase(timer, Phase::other);
      ops::rms_norm(q, pv.narrow(1, col.fa_q, hfa * d).split_dim(1, hfa, d), w.q_norm, norm);
      ops::rms_norm(k, pv.narrow(1, col.fa_k, gfa * d).split_dim(1, gfa, d), w.k_norm, norm);
    }
    // fp32 accumulator of the ring's partial results (DESIGN.md §2); gated into the head buffer.
    Tensor o_acc = Tensor::empty({t, hfa, d}, acc_dtype(), device_), lse = Tensor::empty({hfa, t}, acc_dtype(), device_);
    ring_attention(context.comm, context.layout, o_acc, lse, q, k, v,
                   ops::AttentionParams{.tau_log_base = config_.fa_log_base, .kv_head_of_query = w.fa_kv_of}, timer);
    ScopedPhase phase(timer, Phase::other);
    // A forward that saves gates the kept output (dtype()), as the backward's recomputation does:
    // the recomputed residual then equals this forward's bit for bit, so what else the forward
    // keeps (the MLP's gate/up) is what the backward would have recomputed.
    TensorView gated = o_acc.view();
    if (saved) {
      saved->fa_out = to(o_acc, device_, dtype_);
      saved->fa_lse = lse;
      gated = saved->fa_out.view();
    }
    ops::sigmoid_gate(heads.view().reshape({t, H * d}).narrow(1, 0, hfa * d), gated.reshape({t, hfa * d}), gate);
  };
  auto gdn_branch = [&] {
    Communicator& comm = context.comm;
    const TensorView qkv = pv.narrow(1, col.gdn_qkv, 3 * hg * d);
    const TensorView a = pv.narrow(1, col.gdn_a, hg), b = pv.narrow(1, col.gdn_b, hg);
    // conv + SiLU, then RoPE and the L2 norm of q and k, in one pass (ops::gdn_qkv_conv).
    Tensor conv = Tensor::empty({t, 3 * hg * d}, dtype_, device_);
    Tensor inv_norm = Tensor::empty({t, 2 * hg}, acc_dtype(), device_);
    const GdnQkFinish finish{positions, inv_norm, gdn_qk_params(hg)};
    causal_conv_sequence_parallel(comm, context.layout, conv, qkv, w.conv, timer, &finish);
    const TensorView q = conv.view().narrow(1, 0, hg * d).split_dim(1, hg, d);
    const TensorView k = conv.view().narrow(1, hg * d, hg * d).split_dim(1, hg, d);
    const TensorView v = conv.view().narrow(1, 2 * hg * d, hg * d).split_dim(1, hg, d);
    Tensor beta = Tensor::empty({t, hg}, acc_dtype(), device_), g = Tensor::empty({t, hg}, acc_dtype(), device_);
    {
      ScopedPhase phase(timer, Phase::gdn);
      ops::gdn_gates(beta, g, b, a, w.a_log, w.dt_bias);
    }
    const TensorView out = heads.view().narrow(1, hfa, hg);
    gdn_sequence_parallel(comm, context.layout, out, q, k, v, g, beta, ops::DeltaRuleParams{}, timer,
                          saved ? &saved->gdn : nullptr);
    if (saved && context.keep.gdn_outputs) {
      ScopedPhase phase(timer, Phase::gdn);
      saved->gdn_out = clone(out);
    }
  };
  // The branches are independent (DESIGN.md §3.5): on the GPU the GDN branch runs on a side stream
  // while the FA ring's transfers and attention run on this one. Collectives of both branches go
  // through the communicator's own stream in the host order (GDN first), the same on every rank, so
  // the overlap cannot reorder them across ranks.
  if (hfa > 0 && hg > 0) {
    run_concurrently(device_, fa_branch, gdn_branch);
  } else if (hfa > 0) {
    fa_branch();
  } else if (hg > 0) {
    gdn_branch();
  }
  {
    ScopedPhase phase(timer, Phase::other);
    ops::head_fusion(heads, heads, w.fuse_norm, w.fuse_gamma, {static_cast<float>(config_.rms_norm_eps)});
  }
  if (context.observer) context.observer->on_head_outputs(layer, heads, w.head_of);
  ScopedPhase phase(timer, Phase::gemm);
  ops::linear(x, heads.view().reshape({t, H * d}), w.o_proj, ops::Accumulate::yes);
}

void Model::mlp(ForwardContext& context, int64_t layer, const TensorView& x, const TensorView& gate_up) const {
  const LayerWeights& w = layers_at(layer);
  const int64_t t = x.size(0), I = config_.intermediate_size, tile = std::min(t, kMlpTileTokens);
  if (gate_up.defined()) expect_shape(gate_up, "kept MLP gate | up", {{"T_loc", t}, {"2I", 2 * I}});
  Tensor x_norm = Tensor::empty({tile, config_.hidden_size}, dtype_, device_);
  Tensor gu_tile = gate_up.defined() ? Tensor() : Tensor::empty({tile, 2 * I}, dtype_, device_);
  Tensor h = Tensor::empty({tile, I}, dtype_, device_);
  for (int64_t t0 = 0; t0 < t; t0 += tile) {  // token-local: tiles bound the intermediate's size
    const int64_t n = std::min(tile, t - t0);
    const TensorView xt = x.narrow(0, t0, n), xn = x_norm.view().narrow(0, 0, n);
    const TensorView gu = gate_up.defined() ? gate_up.narrow(0, t0, n) : gu_tile.view().narrow(0, 0, n);
    const TensorView ht = h.view().narrow(0, 0, n);
    {
      ScopedPhase phase(context.timer, Phase::other);
      ops::rms_norm(xn, xt, w.post_norm, {static_cast<float>(config_.rms_norm_eps)});
    }
    {
      ScopedPhase phase(context.timer, Phase::gemm);
      ops::linear(gu, xn, w.mlp_in);
    }
    {
      ScopedPhase phase(context.timer, Phase::other);
      ops::swiglu(ht, gu.narrow(1, 0, I), gu.narrow(1, I, I));
    }
    ScopedPhase phase(context.timer, Phase::gemm);
    ops::linear(xt, ht, w.mlp_down, ops::Accumulate::yes);
  }
}

void Model::lm_head(const TensorView& logits, const TensorView& hidden) const {
  expect_shape(logits, "logits", {{"n", hidden.size(0)}, {"V", config_.vocab_size}});
  ops::linear(logits, hidden, weights_.lm_head);
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
