#include "model/params.h"

#include <cmath>
#include <set>


namespace hydra {

std::string layer_prefix(int64_t layer) { return fmt::format("model.layers.{}.", layer); }

std::vector<ParamSpec> parameter_specs(const ModelConfig& c) {
  const int64_t D = c.hidden_size, d = c.head_dim, H = c.num_heads, G = c.num_kv_heads, I = c.intermediate_size;
  std::vector<ParamSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, D}, Init::normal});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = layer_prefix(l);
    specs.push_back({p + "input_layernorm.weight", {D}, Init::norm_weight});
    specs.push_back({p + "self_attn.q_proj.weight", {H * d, D}, Init::normal});
    if (!c.is_hydra()) {
      specs.push_back({p + "self_attn.k_proj.weight", {G * d, D}, Init::normal});
      specs.push_back({p + "self_attn.v_proj.weight", {G * d, D}, Init::normal});
      specs.push_back({p + "self_attn.q_norm.weight", {d}, Init::norm_weight});
      specs.push_back({p + "self_attn.k_norm.weight", {d}, Init::norm_weight});
    } else {
      const int64_t hfa = static_cast<int64_t>(c.fa_heads_of(l).size());
      const int64_t gfa = static_cast<int64_t>(c.fa_kv_heads_of(l).size());
      const int64_t hg = H - hfa;
      if (hfa > 0) {
        specs.push_back({p + "self_attn.k_proj.weight", {gfa * d, D}, Init::normal});
        specs.push_back({p + "self_attn.v_proj.weight", {gfa * d, D}, Init::normal});
        specs.push_back({p + "self_attn.q_norm.weight", {d}, Init::norm_weight});
        specs.push_back({p + "self_attn.k_norm.weight", {d}, Init::norm_weight});
        specs.push_back({p + "self_attn.fa_gate_proj.weight", {hfa * d, D}, Init::normal});
      }
      if (hg > 0) {
        specs.push_back({p + "self_attn.gdn_k_proj.weight", {hg * d, D}, Init::normal});
        specs.push_back({p + "self_attn.gdn_v_proj.weight", {hg * d, D}, Init::normal});
        specs.push_back({p + "self_attn.gdn_q_conv.weight", {hg * d, c.conv_kernel}, Init::conv});
        specs.push_back({p + "self_attn.gdn_k_conv.weight", {hg * d, c.conv_kernel}, Init::conv});
        specs.push_back({p + "self_attn.gdn_v_conv.weight", {hg * d, c.conv_kernel}, Init::conv});
        specs.push_back({p + "self_attn.gdn_a_proj.weight", {hg, D}, Init::small_normal});
        specs.push_back({p + "self_attn.gdn_b_proj.weight", {hg, D}, Init::small_normal});
        specs.push_back({p + "self_attn.gdn_A_log", {hg}, Init::a_log});
        specs.push_back({p + "self_attn.gdn_dt_bias", {hg}, Init::dt_bias});
      }
      if (ops::fusion_has_norm(c.fusion)) specs.push_back({p + "self_attn.fuse_norm.weight", {H, d}, Init::norm_weight});
      if (ops::fusion_has_gamma(c.fusion)) specs.push_back({p + "self_attn.fuse_gamma", {H}, Init::ones});
      if (ops::fusion_has_gate(c.fusion)) {
        specs.push_back({p + "self_attn.fuse_gate.weight", {H, D}, Init::normal});
        specs.push_back({p + "self_attn.fuse_gate.bias", {H}, Init::small_normal});
      }
    }
    specs.push_back({p + "self_attn.o_proj.weight", {D, H * d}, Init::normal});
    specs.push_back({p + "post_attention_layernorm.weight", {D}, Init::norm_weight});
    specs.push_back({p + "mlp.gate_proj.weight", {I, D}, Init::normal});
    specs.push_back({p + "mlp.up_proj.weight", {I, D}, Init::normal});
    specs.push_back({p + "mlp.down_proj.weight", {D, I}, Init::normal});
  }
  specs.push_back({"model.norm.weight", {D}, Init::norm_weight});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, D}, Init::normal});
  return specs;
}

void init_parameter(const ParamSpec& spec, uint64_t seed, const TensorView& out) {
  const RandomStream rng{seed, hash_name(spec.name)};
  const double kernel = spec.shape.size() == 2 ? static_cast<double>(spec.shape[1]) : 1.0;
  if (out.device() == Device::cuda) {
#if HYDRA_CUDA
    init_parameter_cuda(spec.init, rng, kernel, out);
    return;
#endif
  }
  HYDRA_ASSERT(out.on_host() && out.dtype() == DType::f32 && out.is_contiguous(), "init of {}", spec.name);
  float* p = out.data_as<float>();
  for (int64_t i = 0; i < out.numel(); ++i) p[i] = static_cast<float>(init_value(spec.init, rng, static_cast<uint64_t>(i), kernel));
}

NamedTensors random_parameters(const ModelConfig& config, uint64_t seed, Device device, DType dtype) {
  NamedTensors tensors;
  for (const ParamSpec& spec : parameter_specs(config)) {
    Tensor t = Tensor::empty(spec.shape, device == Device::host ? DType::f32 : dtype, device);
    init_parameter(spec, seed, t);
    tensors.emplace(spec.name, std::move(t));
  }
  return tensors;
}

std::string fusion_note(const ModelConfig& config, const std::string& name) {
  if (!config.is_hydra() || name.find(".self_attn.fuse_") == std::string::npos) return "";
  return fmt::format(" (the config's fusion is {})", ops::fusion_name(config.fusion));
}

void validate_parameters(const ModelConfig& config, const NamedTensors& tensors, const std::string& source) {
  std::set<std::string> expected;
  for (const ParamSpec& spec : parameter_specs(config)) {
    expected.insert(spec.name);
    const auto it = tensors.find(spec.name);
    HYDRA_USER_CHECK(it != tensors.end(), "{}: tensor '{}' is missing{}", source, spec.name, fusion_note(config, spec.name));
    const TensorView shape_of_spec(nullptr, DType::f32, Device::host, spec.shape);
    HYDRA_USER_CHECK(std::equal(spec.shape.begin(), spec.shape.end(), it->second.shape().begin(),
                                it->second.shape().end()),
                     "{}: tensor '{}' has shape {}, the config needs {}", source, spec.name,
                     it->second.shape_string(), shape_of_spec.shape_string());
  }
  for (const auto& [name, tensor] : tensors) {
    HYDRA_USER_CHECK(expected.count(name), "{}: unexpected tensor '{}' for this config{}", source, name,
                     fusion_note(config, name));
  }
}

int64_t parameter_count(const ModelConfig& config) {
  int64_t n = 0;
  for (const ParamSpec& spec : parameter_specs(config)) {
    int64_t m = 1;
    for (int64_t s : spec.shape) m *= s;
    n += m;
  }
  return n;
}

}  // namespace hydra
