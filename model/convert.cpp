#include "model/convert.h"

#include <cmath>

#include "model/params.h"

namespace hydra {

ModelConfig student_config(const ModelConfig& teacher, const std::vector<std::vector<int>>& fa_heads,
                           ops::Fusion fusion) {
  HYDRA_USER_CHECK(teacher.arch == Arch::qwen3, "the teacher must be a qwen3 checkpoint (got a {} model)",
                   arch_name(teacher.arch));
  ModelConfig s = teacher;
  s.arch = Arch::hydrahead;
  s.fa_heads = fa_heads;
  s.fusion = fusion;
  s.validate();
  return s;
}

namespace {

// Accumulates Σ o² per (layer, head) over this rank's tokens.
class HeadSquareSums final : public LayerObserver {
 public:
  HeadSquareSums(int64_t layers, int64_t heads) : sums_(Tensor::zeros({layers, heads}, DType::f32)), heads_(heads) {}
  void on_head_outputs(int64_t layer, const TensorView& o, std::span<const int> head_of) override {
    Tensor host = to(o, Device::host, DType::f32);  // [T, H, d]
    const int64_t t = host.size(0), d = host.size(2);
    for (int64_t p = 0; p < heads_; ++p) {
      double s = 0;
      for (int64_t i = 0; i < t; ++i) {
        const float* row = static_cast<const float*>(host.view().element_ptr({i, p}));
        for (int64_t c = 0; c < d; ++c) s += static_cast<double>(row[c]) * row[c];
      }
      sums_.data_as<float>()[layer * heads_ + head_of[static_cast<size_t>(p)]] += static_cast<float>(s);
    }
  }
  Tensor& sums() { return sums_; }

 private:
  Tensor sums_;  // [L, H]
  int64_t heads_;
};

// γ of the `scale` fusion, layer by layer in one forward of a student whose γ are 1: at each layer the
// heads' own RMS over all ranks' tokens gives γ_h = teacher RMS / own RMS, and the head outputs are
// scaled by it in place, so the later layers see the calibrated stream and match in turn.
class ScaleCalibration final : public LayerObserver {
 public:
  ScaleCalibration(Communicator& comm, const std::vector<std::vector<double>>& teacher_rms, int64_t tokens)
      : comm_(comm), teacher_rms_(teacher_rms), gamma_(teacher_rms), tokens_(tokens) {}
  void on_head_outputs(int64_t layer, const TensorView& o, std::span<const int> head_of) override {
    Tensor host = to(o, Device::host, DType::f32);  // [T, H, d]
    const int64_t t = host.size(0), heads = host.size(1), d = host.size(2);
    Tensor sums = Tensor::zeros({heads}, DType::f32);
    for (int64_t p = 0; p < heads; ++p) {
      double s = 0;
      for (int64_t i = 0; i < t; ++i) {
        const float* row = static_cast<const float*>(host.view().element_ptr({i, p}));
        for (int64_t c = 0; c < d; ++c) s += static_cast<double>(row[c]) * row[c];
      }
      sums.data_as<float>()[p] = static_cast<float>(s);
    }
    comm_.all_reduce_sum(sums);  // every rank reaches every layer: the same collectives in the same order
    for (int64_t p = 0; p < heads; ++p) {
      const int h = head_of[static_cast<size_t>(p)];
      const double own = std::sqrt(sums.data_as<float>()[p] / static_cast<double>(tokens_ * d));
      const double g = own > 0 ? teacher_rms_[layer][h] / own : 1.0;  // a head of zeros keeps γ = 1
      gamma_[layer][h] = g;
      for (int64_t i = 0; i < t; ++i) {
        float* row = static_cast<float*>(host.view().element_ptr({i, p}));
        for (int64_t c = 0; c < d; ++c) row[c] = static_cast<float>(row[c] * g);
      }
    }
    copy_into(o, to(host, o.device(), o.dtype()));
  }
  const std::vector<std::vector<double>>& gamma() const { return gamma_; }

 private:
  Communicator& comm_;
  const std::vector<std::vector<double>>& teacher_rms_;
  std::vector<std::vector<double>> gamma_;  // [L][H]
  int64_t tokens_;
};

Tensor constant(std::initializer_list<int64_t> shape, float value) {
  Tensor t = Tensor::empty(shape, DType::f32);
  fill(t, value);
  return t;
}

}  // namespace

std::vector<std::vector<double>> measure_head_rms(const Model& teacher, Communicator& comm,
                                                  const std::vector<int32_t>& tokens) {
  const ModelConfig& c = teacher.config();
  const int64_t total = static_cast<int64_t>(tokens.size());
  const SequenceLayout layout = group_layout(comm, total);
  const Tensor ids = layout.token_rows(tokens).ids;
  HeadSquareSums sums(c.num_layers, c.num_heads);
  ForwardContext context{comm, layout, &sums};
  teacher.forward(context, ids);
  comm.all_reduce_sum(sums.sums());
  std::vector<std::vector<double>> rms(static_cast<size_t>(c.num_layers), std::vector<double>(static_cast<size_t>(c.num_heads)));
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (int64_t h = 0; h < c.num_heads; ++h)
      rms[l][h] = std::sqrt(sums.sums().data_as<float>()[l * c.num_heads + h] / static_cast<double>(total * c.head_dim));
  return rms;
}

std::vector<std::vector<double>> calibrate_scale_gamma(const Model& student, Communicator& comm,
                                                       const std::vector<int32_t>& tokens,
                                                       const std::vector<std::vector<double>>& teacher_rms) {
  const ModelConfig& c = student.config();
  HYDRA_ASSERT(c.is_hydra() && c.fusion == ops::Fusion::scale, "scale calibration of a {} model with fusion {}",
               arch_name(c.arch), ops::fusion_name(c.fusion));
  const int64_t total = static_cast<int64_t>(tokens.size());
  const SequenceLayout layout = group_layout(comm, total);
  ScaleCalibration calibration(comm, teacher_rms, total);
  ForwardContext context{comm, layout, &calibration};
  student.forward(context, layout.token_rows(tokens).ids);
  return calibration.gamma();
}

NamedTensors convert_parameters(const ModelConfig& teacher_config, const NamedTensors& teacher,
                                const ModelConfig& student, uint64_t seed,
                                const std::vector<std::vector<double>>& gamma) {
  HYDRA_ASSERT(student.is_hydra() && teacher_config.arch == Arch::qwen3, "convert qwen3 -> hydrahead");
  validate_parameters(teacher_config, teacher, "teacher");
  const int64_t d = student.head_dim, H = student.num_heads;
  auto get = [&](const std::string& name) -> const Tensor& { return teacher.at(name); };
  // Stacks d-row blocks of `m` (one per index) into a new matrix.
  auto head_blocks = [&](const Tensor& m, const std::vector<int>& idx) {
    Tensor out = Tensor::empty({static_cast<int64_t>(idx.size()) * d, m.size(1)}, DType::f32);
    for (size_t i = 0; i < idx.size(); ++i) copy_into(out.view().narrow(0, static_cast<int64_t>(i) * d, d), m.view().narrow(0, idx[i] * d, d));
    return out;
  };
  NamedTensors out;
  for (const ParamSpec& spec : parameter_specs(student)) {
    const std::string& name = spec.name;
    if (teacher.count(name) && name.find("self_attn.k_proj") == std::string::npos &&
        name.find("self_attn.v_proj") == std::string::npos) {
      out.emplace(name, clone(get(name)));  // embedding, norms, MLP, W_q (all heads), W_o, lm_head
      continue;
    }
    // model.layers.{l}.self_attn.<param>
    const size_t at = name.find(".self_attn.");
    HYDRA_ASSERT(at != std::string::npos, "unexpected student parameter {}", name);
    const int64_t layer = std::stoll(name.substr(std::string("model.layers.").size()));
    const std::string prefix = name.substr(0, at + 11), param = name.substr(at + 11);
    std::vector<int> gdn = student.gdn_heads_of(layer), gdn_kv;
    for (int h : gdn) gdn_kv.push_back(static_cast<int>(student.kv_head_of(h)));
    if (param == "k_proj.weight" || param == "v_proj.weight") {
      out.emplace(name, head_blocks(get(name), student.fa_kv_heads_of(layer)));
    } else if (param == "fa_gate_proj.weight") {
      out.emplace(name, Tensor::zeros(spec.shape, DType::f32));
    } else if (param == "gdn_k_proj.weight") {
      out.emplace(name, head_blocks(get(prefix + "k_proj.weight"), gdn_kv));
    } else if (param == "gdn_v_proj.weight") {
      out.emplace(name, head_blocks(get(prefix + "v_proj.weight"), gdn_kv));
    } else if (param == "gdn_q_conv.weight" || param == "gdn_k_conv.weight" || param == "gdn_v_conv.weight") {
      Tensor taps = Tensor::zeros(spec.shape, DType::f32);
      for (int64_t ch = 0; ch < spec.shape[0]; ++ch) taps.data_as<float>()[ch * spec.shape[1] + spec.shape[1] - 1] = 1.0f;
      out.emplace(name, std::move(taps));
    } else if (param == "gdn_a_proj.weight" || param == "gdn_b_proj.weight" || param == "gdn_A_log" ||
               param == "gdn_dt_bias") {
      Tensor t = Tensor::empty(spec.shape, DType::f32);
      init_parameter(spec, seed, t);  // N(0, 0.02²), ln U(1,16), softplus⁻¹(log-uniform dt)
      out.emplace(name, std::move(t));
    } else if (param == "fuse_norm.weight") {
      out.emplace(name, constant({H, d}, 1.0f));
    } else if (param == "fuse_gate.weight" || param == "fuse_gate.bias") {
      out.emplace(name, Tensor::zeros(spec.shape, DType::f32));  // 2σ(0) = 1: the gate starts open, as scale_norm
    } else if (param == "fuse_gamma") {
      Tensor g = constant({H}, 1.0f);
      if (!gamma.empty()) {
        for (int64_t h = 0; h < H; ++h) g.data_as<float>()[h] = static_cast<float>(gamma[layer][h]);
      }
      out.emplace(name, std::move(g));
    } else {
      HYDRA_ASSERT(false, "no migration rule for {}", name);
    }
  }
  validate_parameters(student, out, "converted student");
  return out;
}

}  // namespace hydra
