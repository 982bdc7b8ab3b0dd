// The parameters of a model: their names, shapes and initialisers (DESIGN.md §1, §4).
//
// Names follow HF `Qwen3ForCausalLM` paths where a teacher counterpart exists. HydraHead layers
// add (H_fa = |F_l|, H_gdn = H − H_fa, G_fa = KV heads used by F_l, all lists ascending):
//   self_attn.q_proj.weight        [H·d, D]      every head, original order (FA and GDN heads)
//   self_attn.k_proj/v_proj.weight [G_fa·d, D]   rows of the FA heads' KV heads only
//   self_attn.q_norm/k_norm.weight [d]           FA heads
//   self_attn.fa_gate_proj.weight  [H_fa·d, D]   W_fgate of the FA heads
//   self_attn.gdn_k_proj/gdn_v_proj.weight [H_gdn·d, D]   per GDN head K/V
//   self_attn.gdn_q_conv/gdn_k_conv/gdn_v_conv.weight [H_gdn·d, K]   depthwise conv taps
//   self_attn.gdn_a_proj/gdn_b_proj.weight [H_gdn, D], self_attn.gdn_A_log/gdn_dt_bias [H_gdn]
//   self_attn.fuse_norm.weight [H, d], self_attn.fuse_gamma [H]   fusion, original head order; the
//     variants (kernels/fusion/fusion.h) without a norm lack fuse_norm, those without a γ fuse_gamma;
//   self_attn.fuse_gate.weight [H, D], self_attn.fuse_gate.bias [H]   the fusion gate (gate only)
//   self_attn.o_proj.weight [D, H·d]
// Tensors of a branch a layer does not have (no FA heads, or no GDN heads) are absent.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "model/config.h"
#include "runtime/checkpoint.h"
#include "runtime/random.h"

namespace hydra {

enum class Init {
  normal,          // N(0, 0.02²): projections and embeddings
  norm_weight,     // 1 + N(0, 0.1²): RMSNorm weights, non-trivial so tests see them
  conv,            // N(0, 1/K): conv taps
  small_normal,    // N(0, 0.02²): w_a, w_b
  a_log,           // ln U(1, 16)
  dt_bias,         // softplus⁻¹(dt), dt log-uniform in [1e-3, 0.1]
  ones,            // fusion gamma
  unit_normal,     // N(0, 1): benchmark and test inputs
};

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  Init init = Init::normal;
};

std::string layer_prefix(int64_t layer);  // "model.layers.{l}."
std::vector<ParamSpec> parameter_specs(const ModelConfig& config);

// Element i of a parameter initialised with `init` (kernel = K for conv taps). The one formula both
// the host and the GPU initialisers use, so a tensor drawn on either device is the same.
HYDRA_HOST_DEVICE inline double init_value(Init init, const RandomStream& rng, uint64_t i, double kernel) {
  switch (init) {
    case Init::normal:
    case Init::small_normal: return 0.02 * rng.normal(i);
    case Init::norm_weight: return 1.0 + 0.1 * rng.normal(i);
    // The C library's functions (::), which host and device code both have; hydra::log is the logger.
    case Init::conv: return rng.normal(i) / ::sqrt(kernel);
    case Init::a_log: return ::log(1.0 + 15.0 * rng.uniform(i));
    case Init::dt_bias: {
      const double dt = ::exp(::log(1e-3) + (::log(0.1) - ::log(1e-3)) * rng.uniform(i));
      return dt + ::log(-::expm1(-dt));  // softplus⁻¹(dt) = log(e^dt − 1)
    }
    case Init::ones: return 1.0;
    case Init::unit_normal: return rng.normal(i);
  }
  return 0.0;
}

// Fills a contiguous f32 (host) or f32/bf16 (CUDA) tensor for `spec` from (seed, name):
// reproducible and order-independent.
void init_parameter(const ParamSpec& spec, uint64_t seed, const TensorView& out);
// All parameters of `config`, randomly initialised: host f32, or on the GPU in `dtype` (drawn there).
NamedTensors random_parameters(const ModelConfig& config, uint64_t seed, Device device = Device::host,
                               DType dtype = DType::f32);

// Checks that `tensors` holds exactly the parameters of `config` with their shapes; `source` names
// the file in the message ("tensor 'x' has shape [..], the config needs [..]").
void validate_parameters(const ModelConfig& config, const NamedTensors& tensors, const std::string& source);

int64_t parameter_count(const ModelConfig& config);

// " (the config's fusion is NAME)" for a fusion tensor of a hybrid, else "": for messages about a
// tensor that is missing or left over, whose cause may be a checkpoint of another fusion variant.
std::string fusion_note(const ModelConfig& config, const std::string& name);

#if HYDRA_CUDA
// params_init.cu: the GPU initialiser behind init_parameter for CUDA tensors.
void init_parameter_cuda(Init init, const RandomStream& rng, double kernel, const TensorView& out);
#endif

}  // namespace hydra
