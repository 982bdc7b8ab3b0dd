#include "model/model.h"

#include <cmath>
#include <numeric>

#include <nlohmann/json.hpp>

#include "kernels/elementwise/elementwise.h"
#include "kernels/embedding/embedding.h"
#include "kernels/fusion/fusion.h"
#include "kernels/gdn_gates/gdn_gates.h"
#include "kernels/l2norm/l2norm.h"
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

constexpr int64_t kInProjAlign = 64;  // rows of the fused projection: 16-byte aligned column blocks

const Tensor& param(const NamedTensors& params, const std::string& name) {
  const auto it = params.find(name);
  HYDRA_ASSERT(it != params.end(), "parameter '{}' missing", name);
  return it->second;
}

// Stacks row blocks (on the parameters' device) into one matrix, zero-padded to a multiple of
// `align` rows, and places it.
Tensor stack_rows(const std::vector<TensorView>& parts, Device device, DType dtype, int64_t align = 1) {
  HYDRA_ASSERT(!parts.empty(), "stack of nothing");
  int64_t n = 0;
  const int64_t cols = parts.front().size(1);
  for (const TensorView& p : parts) n += p.size(0);
  const int64_t padded = (n + align - 1) / align * align;
  Tensor staged = Tensor::zeros({padded, cols}, parts.front().dtype(), parts.front().device());
  int64_t at = 0;
  for (const TensorView& p : parts) {
    HYDRA_ASSERT(p.size(1) == cols, "stack of {} columns with {}", cols, p.size(1));
    copy_into(staged.view().narrow(0, at, p.size(0)), p);
    at += p.size(0);
  }
  return to(staged, device, dtype);
}

Tensor place(const TensorView& t, Device device, DType dtype) { return to(t, device, dtype); }

// Per-head blocks of rows [d each] of `m` (heads given).
std::vector<TensorView> head_rows(const Tensor& m, const std::vector<int>& heads, int64_t d) {
  std::vector<TensorView> out;
  for (int h : heads) out.push_back(m.view().narrow(0, h * d, d));
  return out;
}

void append(std::vector<TensorView>& a, const std::vector<TensorView>& b) { a.insert(a.end(), b.begin(), b.end()); }

}  // namespace

Model::Model(ModelConfig config, const NamedTensors& params, Device device, DType dtype)
    : config_(std::move(config)), device_(device), dtype_(dtype) {
  config_.validate();
  validate_parameters(config_, params, "model parameters");
  HYDRA_ASSERT(device == Device::cuda || dtype == DType::f32, "the CPU path runs in float32 (SPEC 2)");
  const ModelConfig& c = config_;
  const int64_t d = c.head_dim, H = c.num_heads;
  embed_ = place(param(params, "model.embed_tokens.weight"), device, dtype);
  final_norm_ = place(param(params, "model.norm.weight"), device, DType::f32);
  lm_head_ = c.tie_word_embeddings ? embed_ : place(param(params, "lm_head.weight"), device, dtype);
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = layer_prefix(l);
    auto get = [&](const std::string& name) -> const Tensor& { return param(params, p + name); };
    LayerWeights& w = layers_[static_cast<size_t>(l)];
    w.input_norm = place(get("input_layernorm.weight"), device, DType::f32);
    w.post_norm = place(get("post_attention_layernorm.weight"), device, DType::f32);
    w.mlp_in = stack_rows({get("mlp.gate_proj.weight"), get("mlp.up_proj.weight")}, device, dtype);
    w.mlp_down = place(get("mlp.down_proj.weight"), device, dtype);
    const Tensor& q_proj = get("self_attn.q_proj.weight");
    const Tensor& o_proj = get("self_attn.o_proj.weight");
    if (!c.is_hydra()) {
      w.head_of.resize(static_cast<size_t>(H));
      std::iota(w.head_of.begin(), w.head_of.end(), 0);
      w.h_fa = H;
      w.g_fa = c.num_kv_heads;
      for (int h = 0; h < H; ++h) w.fa_kv_of.push_back(static_cast<int>(c.kv_head_of(h)));
      w.in_proj = stack_rows({q_proj, get("self_attn.k_proj.weight"), get("self_attn.v_proj.weight")}, device, dtype,
                             kInProjAlign);
      w.q_norm = place(get("self_attn.q_norm.weight"), device, DType::f32);
      w.k_norm = place(get("self_attn.k_norm.weight"), device, DType::f32);
      w.o_proj = place(o_proj, device, dtype);
      continue;
    }
    const std::vector<int>& fa = c.fa_heads_of(l);
    const std::vector<int> gdn = c.gdn_heads_of(l);
    const std::vector<int> fa_kv = c.fa_kv_heads_of(l);
    w.h_fa = static_cast<int64_t>(fa.size());
    w.g_fa = static_cast<int64_t>(fa_kv.size());
    w.h_gdn = static_cast<int64_t>(gdn.size());
    w.head_of = fa;
    w.head_of.insert(w.head_of.end(), gdn.begin(), gdn.end());
    for (int h : fa) {
      const int kv = static_cast<int>(c.kv_head_of(h));
      w.fa_kv_of.push_back(static_cast<int>(std::find(fa_kv.begin(), fa_kv.end(), kv) - fa_kv.begin()));
    }
    std::vector<TensorView> in_rows;
    if (w.h_fa > 0) {
      append(in_rows, head_rows(q_proj, fa, d));
      in_rows.push_back(get("self_attn.k_proj.weight"));
      in_rows.push_back(get("self_attn.v_proj.weight"));
      in_rows.push_back(get("self_attn.fa_gate_proj.weight"));
      w.q_norm = place(get("self_attn.q_norm.weight"), device, DType::f32);
      w.k_norm = place(get("self_attn.k_norm.weight"), device, DType::f32);
    }
    if (w.h_gdn > 0) {
      append(in_rows, head_rows(q_proj, gdn, d));
      in_rows.push_back(get("self_attn.gdn_k_proj.weight"));
      in_rows.push_back(get("self_attn.gdn_v_proj.weight"));
      in_rows.push_back(get("self_attn.gdn_a_proj.weight"));
      in_rows.push_back(get("self_attn.gdn_b_proj.weight"));
      w.conv = stack_rows({get("self_attn.gdn_q_conv.weight"), get("self_attn.gdn_k_conv.weight"),
                           get("self_attn.gdn_v_conv.weight")},
                          device, DType::f32);
      w.a_log = place(get("self_attn.gdn_A_log"), device, DType::f32);
      w.dt_bias = place(get("self_attn.gdn_dt_bias"), device, DType::f32);
    }
    w.in_proj = stack_rows(in_rows, device, dtype, kInProjAlign);
    // Fusion weights and W_o columns in physical head order.
    const Tensor& fuse = get("self_attn.fuse_norm.weight");
    const Tensor& gamma = get("self_attn.fuse_gamma");
    const Device staging = fuse.device();
    Tensor fuse_p = Tensor::empty({H, d}, fuse.dtype(), staging), gamma_p = Tensor::empty({H}, gamma.dtype(), staging);
    Tensor o_p = Tensor::empty({c.hidden_size, H * d}, o_proj.dtype(), staging);
    for (int64_t pos = 0; pos < H; ++pos) {
      const int h = w.head_of[static_cast<size_t>(pos)];
      copy_into(fuse_p.view().select(0, pos), fuse.view().select(0, h));
      copy_into(gamma_p.view().narrow(0, pos, 1), gamma.view().narrow(0, h, 1));
      copy_into(o_p.view().narrow(1, pos * d, d), o_proj.view().narrow(1, h * d, d));
    }
    w.fuse_norm = place(fuse_p, device, DType::f32);
    w.fuse_gamma = place(gamma_p, device, DType::f32);
    w.o_proj = place(o_p, device, dtype);
  }
}

Tensor Model::forward(ForwardContext& context, const TensorView& ids) const {
  const SequenceLayout& layout = context.layout;
  const int64_t t_local = layout.local_length(), D = config_.hidden_size;
  expect_shape(ids, "token ids", {{"T_loc", t_local}});
  HYDRA_ASSERT(context.comm.size() == layout.world_size() && context.comm.rank() == layout.rank(),
               "layout for rank {}/{} used on rank {}/{}", layout.rank(), layout.world_size(), context.comm.rank(),
               context.comm.size());
  const std::vector<int64_t> pos = layout.local_positions();
  Tensor positions = to_device(TensorView(const_cast<int64_t*>(pos.data()), DType::i64, Device::host,
                                          {static_cast<int64_t>(pos.size())}),
                               device_);
  Tensor ids_here = to_device(ids, device_);
  Tensor x = Tensor::empty({t_local, D}, dtype_, device_);  // the residual stream
  Tensor x_norm = Tensor::empty({t_local, D}, dtype_, device_);
  const ops::RmsNormParams norm{static_cast<float>(config_.rms_norm_eps)};
  {
    ScopedPhase phase(context.timer, Phase::other);
    ops::embedding(x, embed_, ids_here);
  }
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    const LayerWeights& w = layers_[static_cast<size_t>(l)];
    maybe_inject_fault("layer");
    {
      ScopedPhase phase(context.timer, Phase::other);
      ops::rms_norm(x_norm, x, w.input_norm, norm);
    }
    if (config_.is_hydra()) {
      attention_hydra(context, l, positions, x_norm, x);
    } else {
      attention_teacher(context, l, positions, x_norm, x);
    }
    mlp(context, l, x);
    if (context.after_layer) context.after_layer(l);
  }
  ScopedPhase phase(context.timer, Phase::other);
  ops::rms_norm(x_norm, x, final_norm_, norm);
  return x_norm;
}

void Model::attention_teacher(ForwardContext& context, int64_t layer, const Tensor& positions,
                              const TensorView& x_norm, const TensorView& x) const {
  const LayerWeights& w = layers_[static_cast<size_t>(layer)];
  const int64_t t = x.size(0), H = config_.num_heads, G = config_.num_kv_heads, d = config_.head_dim;
  PhaseTimer* timer = context.timer;
  Tensor proj = Tensor::empty({t, w.in_proj.size(0)}, dtype_, device_);
  {
    ScopedPhase phase(timer, Phase::gemm);
    ops::linear(proj, x_norm, w.in_proj);
  }
  const TensorView q = proj.view().narrow(1, 0, H * d).split_dim(1, H, d);          // [T, H, d]
  const TensorView k = proj.view().narrow(1, H * d, G * d).split_dim(1, G, d);      // [T, G, d]
  const TensorView v = proj.view().narrow(1, (H + G) * d, G * d).split_dim(1, G, d);
  const ops::RmsNormParams norm{static_cast<float>(config_.rms_norm_eps)};
  {
    ScopedPhase phase(timer, Phase::other);
    ops::rms_norm(q, q, w.q_norm, norm);
    ops::rms_norm(k, k, w.k_norm, norm);
    ops::rope(q, positions, {config_.rope_theta});
    ops::rope(k, positions, {config_.rope_theta});
  }
  Tensor o_acc = Tensor::empty({t, H, d}, DType::f32, device_), lse = Tensor::empty({H, t}, DType::f32, device_);
  ring_attention(context.comm, context.layout, o_acc, lse, q, k, v, ops::AttentionParams{.kv_head_of_query = w.fa_kv_of},
                 timer);
  Tensor o;
  {
    ScopedPhase phase(timer, Phase::other);
    o = to(o_acc, device_, dtype_);
  }
  if (context.observer) context.observer->on_head_outputs(layer, o, w.head_of);
  ScopedPhase phase(timer, Phase::gemm);
  ops::linear(x, o.view().reshape({t, H * d}), w.o_proj, ops::Accumulate::yes);
}

void Model::attention_hydra(ForwardContext& context, int64_t layer, const Tensor& positions,
                            const TensorView& x_norm, const TensorView& x) const {
  const LayerWeights& w = layers_[static_cast<size_t>(layer)];
  const int64_t t = x.size(0), H = config_.num_heads, d = config_.head_dim;
  const int64_t hfa = w.h_fa, gfa = w.g_fa, hg = w.h_gdn;
  PhaseTimer* timer = context.timer;
  Tensor proj = Tensor::empty({t, w.in_proj.size(0)}, dtype_, device_);
  {
    ScopedPhase phase(timer, Phase::gemm);
    ops::linear(proj, x_norm, w.in_proj);
  }
  Tensor heads = Tensor::empty({t, H, d}, dtype_, device_);  // physical order: FA heads, then GDN heads
  const ops::RmsNormParams norm{static_cast<float>(config_.rms_norm_eps)};
  // Column blocks of the fused projection (model.h): FA q, k, v, gate, then GDN q|k|v, a, b.
  const TensorView pv = proj.view();
  const int64_t c_fa = 0, c_gdn = hfa > 0 ? 2 * hfa * d + 2 * gfa * d : 0;
  const int64_t used = c_gdn + (hg > 0 ? 3 * hg * d + 2 * hg : 0);
  HYDRA_ASSERT(used <= proj.size(1), "fused projection has {} columns, {} used", proj.size(1), used);
  auto fa_branch = [&] {
    const TensorView q = pv.narrow(1, c_fa, hfa * d).split_dim(1, hfa, d);
    const TensorView k = pv.narrow(1, c_fa + hfa * d, gfa * d).split_dim(1, gfa, d);
    const TensorView v = pv.narrow(1, c_fa + (hfa + gfa) * d, gfa * d).split_dim(1, gfa, d);
    const TensorView gate = pv.narrow(1, c_fa + (hfa + 2 * gfa) * d, hfa * d);
    {
      ScopedPhase phase(timer, Phase::other);
      ops::rms_norm(q, q, w.q_norm, norm);
      ops::rms_norm(k, k, w.k_norm, norm);
    }
    // fp32 accumulator of the ring's partial results (SPEC 2); gated into the bf16 head buffer.
    Tensor o_acc = Tensor::empty({t, hfa, d}, DType::f32, device_), lse = Tensor::empty({hfa, t}, DType::f32, device_);
    ring_attention(context.comm, context.layout, o_acc, lse, q, k, v,
                   ops::AttentionParams{.tau_log_base = config_.fa_log_base, .kv_head_of_query = w.fa_kv_of}, timer);
    ScopedPhase phase(timer, Phase::other);
    ops::sigmoid_gate(heads.view().reshape({t, H * d}).narrow(1, 0, hfa * d), o_acc.view().reshape({t, hfa * d}), gate);
  };
  auto gdn_branch = [&] {
    Communicator& comm = context.comm;
    const TensorView qkv = pv.narrow(1, c_gdn, 3 * hg * d);
    const TensorView a = pv.narrow(1, c_gdn + 3 * hg * d, hg), b = pv.narrow(1, c_gdn + 3 * hg * d + hg, hg);
    Tensor conv = Tensor::empty({t, 3 * hg * d}, dtype_, device_);
    causal_conv_sequence_parallel(comm, context.layout, conv, qkv, w.conv, timer);
    const TensorView q = conv.view().narrow(1, 0, hg * d).split_dim(1, hg, d);
    const TensorView k = conv.view().narrow(1, hg * d, hg * d).split_dim(1, hg, d);
    const TensorView v = conv.view().narrow(1, 2 * hg * d, hg * d).split_dim(1, hg, d);
    Tensor beta = Tensor::empty({t, hg}, DType::f32, device_), g = Tensor::empty({t, hg}, DType::f32, device_);
    {
      ScopedPhase phase(timer, Phase::gdn);
      ops::rope(q, positions, {config_.rope_theta});
      ops::rope(k, positions, {config_.rope_theta});
      const float l2_eps = static_cast<float>(config_.l2_norm_eps);
      ops::l2_norm(q, l2_eps);
      ops::l2_norm(k, l2_eps);
      ops::gdn_gates(beta, g, b, a, w.a_log, w.dt_bias);
    }
    gdn_sequence_parallel(comm, context.layout, heads.view().narrow(1, hfa, hg), q, k, v, g, beta,
                          ops::DeltaRuleParams{}, timer);
  };
  // The branches are independent (SPEC 3): on the GPU the GDN branch runs on a side stream while
  // the FA ring's transfers and attention run on this one. Collectives of both branches go through
  // the communicator's own stream in the host order (GDN first), the same on every rank, so the
  // overlap cannot reorder them across ranks.
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

void Model::mlp(ForwardContext& context, int64_t layer, const TensorView& x) const {
  const LayerWeights& w = layers_[static_cast<size_t>(layer)];
  const int64_t t = x.size(0), I = config_.intermediate_size, tile = std::min(t, kMlpTileTokens);
  Tensor x_norm = Tensor::empty({tile, config_.hidden_size}, dtype_, device_);
  Tensor gate_up = Tensor::empty({tile, 2 * I}, dtype_, device_);
  Tensor h = Tensor::empty({tile, I}, dtype_, device_);
  for (int64_t t0 = 0; t0 < t; t0 += tile) {  // token-local: tiles bound the intermediate's size
    const int64_t n = std::min(tile, t - t0);
    const TensorView xt = x.narrow(0, t0, n), xn = x_norm.view().narrow(0, 0, n);
    const TensorView gu = gate_up.view().narrow(0, 0, n), ht = h.view().narrow(0, 0, n);
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
  ops::linear(logits, hidden, lm_head_);
}

LoadedCheckpoint read_model_checkpoint(const std::string& path) {
  CheckpointReader reader(path);
  LoadedCheckpoint out;
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(reader.config_json());
  } catch (const nlohmann::json::exception& e) {
    HYDRA_USER_FAIL("{}: the 'config' attribute is not JSON ({})", path, e.what());
  }
  out.config = config_from_json(json, path);
  for (const ParamSpec& spec : parameter_specs(out.config)) {
    HYDRA_USER_CHECK(reader.contains(spec.name), "{}: tensor '{}' is missing", path, spec.name);
    const DatasetInfo info = reader.info(spec.name);
    HYDRA_USER_CHECK(info.dtype == DType::f32 || info.dtype == DType::bf16,
                     "{}: tensor '{}' is {}, expected float32 or bfloat16", path, spec.name, dtype_name(info.dtype));
    HYDRA_USER_CHECK(info.shape == spec.shape, "{}: tensor '{}' has shape {}, the config needs {}", path, spec.name,
                     TensorView(nullptr, DType::f32, Device::host, info.shape).shape_string(),
                     TensorView(nullptr, DType::f32, Device::host, spec.shape).shape_string());
    out.params.emplace(spec.name, reader.read(spec.name, DType::f32));
  }
  validate_parameters(out.config, out.params, path);
  for (const std::string& name : reader.names()) {
    HYDRA_USER_CHECK(out.params.count(name), "{}: unexpected tensor '{}' for this config", path, name);
  }
  return out;
}

void write_model_checkpoint(const std::string& path, const ModelConfig& config, const NamedTensors& params) {
  validate_parameters(config, params, path);
  write_checkpoint(path, config_to_json(config).dump(), params);
}

Model Model::load(const std::string& path, Device device, DType dtype) {
  LoadedCheckpoint ck = read_model_checkpoint(path);
  return Model(std::move(ck.config), ck.params, device, dtype);
}

}  // namespace hydra
