#include "model/convert.h"

#include <algorithm>
#include <cmath>

#include "model/params.h"
#include "runtime/token_file.h"

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

// Σ o² per head of each layer's outputs over this rank's tokens, added into `sums` [L·H] (fp64), all
// layers or only `only` (≥ 0).
class HeadSquareSums final : public LayerObserver {
 public:
  HeadSquareSums(std::vector<double>& sums, int64_t heads, int64_t only = -1) : sums_(sums), heads_(heads), only_(only) {}
  void on_head_outputs(int64_t layer, const TensorView& o, std::span<const int> head_of) override {
    if (only_ >= 0 && layer != only_) return;
    Tensor host = to(o, Device::host, DType::f32);  // [T, H, d]
    const int64_t t = host.size(0), d = host.size(2);
    for (int64_t p = 0; p < host.size(1); ++p) {
      double s = 0;
      for (int64_t i = 0; i < t; ++i) {
        const float* row = static_cast<const float*>(host.view().element_ptr({i, p}));
        for (int64_t c = 0; c < d; ++c) s += static_cast<double>(row[c]) * row[c];
      }
      sums_[static_cast<size_t>(layer * heads_ + head_of[static_cast<size_t>(p)])] += s;
    }
  }

 private:
  std::vector<double>& sums_;
  int64_t heads_, only_;
};

// Multiplies head h's output of layer `layer` by gamma[h] in place.
class HeadScaler final : public LayerObserver {
 public:
  HeadScaler(int64_t layer, const std::vector<double>& gamma) : layer_(layer), gamma_(gamma) {}
  void on_head_outputs(int64_t layer, const TensorView& o, std::span<const int> head_of) override {
    if (layer != layer_) return;
    Tensor host = to(o, Device::host, DType::f32);  // [T, H, d]
    const int64_t t = host.size(0), d = host.size(2);
    for (int64_t p = 0; p < host.size(1); ++p) {
      const double g = gamma_[static_cast<size_t>(head_of[static_cast<size_t>(p)])];
      for (int64_t i = 0; i < t; ++i) {
        float* row = static_cast<float*>(host.view().element_ptr({i, p}));
        for (int64_t c = 0; c < d; ++c) row[c] = static_cast<float>(row[c] * g);
      }
    }
    copy_into(o, to(host, o.device(), o.dtype()));
  }

 private:
  int64_t layer_;
  const std::vector<double>& gamma_;
};

// The sums of every rank added up (through the communicator's device, as NCCL needs), as fp64.
void sum_over_ranks(Communicator& comm, std::vector<double>& sums) {
  Tensor t = Tensor::empty({static_cast<int64_t>(sums.size())}, DType::f64);
  std::copy(sums.begin(), sums.end(), t.data_as<double>());
  all_reduce_sum_host(comm, t);
  std::copy(t.data_as<double>(), t.data_as<double>() + t.numel(), sums.begin());
}

// The layout of window w over the communicator's ranks, and this rank's ids of it (host: embed() places them).
struct WindowRows {
  SequenceLayout layout;
  Tensor ids;
};
WindowRows window_rows(const CalibrationWindows& calib, int64_t w, Communicator& comm) {
  const std::span<const int32_t> window = calib.window(w);
  WindowRows r{group_layout(comm, calib.seq_len, calib.document_starts[static_cast<size_t>(w)]), {}};
  r.ids = r.layout.token_rows(window).ids;
  return r;
}

Tensor constant(std::initializer_list<int64_t> shape, float value) {
  Tensor t = Tensor::empty(shape, DType::f32);
  fill(t, value);
  return t;
}

}  // namespace

CalibrationWindows CalibrationWindows::whole(std::vector<int32_t> tokens) {
  CalibrationWindows c;
  c.seq_len = static_cast<int64_t>(tokens.size());
  c.windows = 1;
  c.ids = std::move(tokens);
  c.document_starts.emplace_back();
  return c;
}

CalibrationWindows read_calibration_windows(const std::string& path, int64_t vocab, int64_t seq_len, int64_t max_tokens,
                                            int ranks) {
  HYDRA_USER_CHECK(seq_len >= 1, "--calib-seq-len must be at least 1 (got {})", seq_len);
  const TokenReader file(path, vocab);
  const int64_t available = max_tokens > 0 ? std::min(file.length(), max_tokens) : file.length();
  const int64_t grain = SequenceLayout::granularity(ranks);
  CalibrationWindows c;
  if (available < seq_len) {
    c.seq_len = available / grain * grain;  // one window, the longest the layout admits
    HYDRA_USER_CHECK(c.seq_len >= 1, "{}: {} calibration token(s) (--calib-tokens {}) are fewer than one sequence on {} "
                     "ranks needs ({})", path, available, max_tokens, ranks, grain);
  } else {
    HYDRA_USER_CHECK(seq_len % grain == 0, "--calib-seq-len {} must be a multiple of {} on {} ranks (the zigzag layout "
                     "cuts a window into 2 segments per rank)", seq_len, grain, ranks);
    c.seq_len = seq_len;
  }
  c.windows = available / c.seq_len;
  c.ids.resize(static_cast<size_t>(c.tokens()));
  file.read_ids(0, std::span<int32_t>(c.ids));
  for (int64_t w = 0; w < c.windows; ++w) {
    std::vector<int64_t> starts;
    if (file.has_documents()) {
      const int64_t begin = w * c.seq_len;
      for (int64_t o : file.document_offsets_in(begin, begin + c.seq_len - 1)) starts.push_back(o - begin);
      if (!starts.empty()) starts.insert(starts.begin(), 0);
    }
    c.document_starts.push_back(std::move(starts));
  }
  return c;
}

std::vector<std::vector<double>> measure_head_rms(const Model& teacher, Communicator& comm,
                                                  const CalibrationWindows& calib, const CalibrationProgress& progress) {
  const ModelConfig& c = teacher.config();
  std::vector<double> sums(static_cast<size_t>(c.num_layers * c.num_heads), 0.0);
  HeadSquareSums observer(sums, c.num_heads);
  for (int64_t w = 0; w < calib.windows; ++w) {
    const WindowRows rows = window_rows(calib, w, comm);
    ForwardContext context{comm, rows.layout, &observer};
    teacher.forward(context, rows.ids);
    if (progress) progress(w + 1, calib.windows);
  }
  sum_over_ranks(comm, sums);
  std::vector<std::vector<double>> rms(static_cast<size_t>(c.num_layers), std::vector<double>(static_cast<size_t>(c.num_heads)));
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (int64_t h = 0; h < c.num_heads; ++h)
      rms[l][h] = std::sqrt(sums[static_cast<size_t>(l * c.num_heads + h)] / static_cast<double>(calib.tokens() * c.head_dim));
  return rms;
}

std::vector<std::vector<double>> calibrate_scale_gamma(const Model& student, Communicator& comm,
                                                       const CalibrationWindows& calib,
                                                       const std::vector<std::vector<double>>& teacher_rms,
                                                       const CalibrationProgress& progress) {
  const ModelConfig& c = student.config();
  HYDRA_ASSERT(c.is_hydra() && c.fusion == ops::Fusion::scale, "scale calibration of a {} model with fusion {}",
               arch_name(c.arch), ops::fusion_name(c.fusion));
  // Every window's residual stream, carried through the layers one layer at a time.
  std::vector<WindowRows> rows;
  std::vector<Tensor> x, positions;
  for (int64_t w = 0; w < calib.windows; ++w) {
    rows.push_back(window_rows(calib, w, comm));
    x.push_back(student.embed(rows.back().ids));
    positions.push_back(student.positions(rows.back().layout));
  }
  std::vector<std::vector<double>> gamma = teacher_rms;
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    std::vector<double> sums(static_cast<size_t>(c.num_layers * c.num_heads), 0.0);
    HeadSquareSums measure(sums, c.num_heads, layer);
    for (int64_t w = 0; w < calib.windows; ++w) {  // the heads' own outputs, on a copy of the stream
      ForwardContext context{comm, rows[static_cast<size_t>(w)].layout, &measure};
      const Tensor copy = clone(x[static_cast<size_t>(w)]);
      student.layer_forward(context, layer, positions[static_cast<size_t>(w)], copy);
    }
    sum_over_ranks(comm, sums);  // every rank reaches every layer: the same collectives in the same order
    for (int64_t h = 0; h < c.num_heads; ++h) {
      const double own = std::sqrt(sums[static_cast<size_t>(layer * c.num_heads + h)] /
                                   static_cast<double>(calib.tokens() * c.head_dim));
      gamma[layer][h] = own > 0 ? teacher_rms[layer][h] / own : 1.0;  // a head of zeros keeps γ = 1
    }
    HeadScaler scale(layer, gamma[layer]);
    for (int64_t w = 0; w < calib.windows; ++w) {  // the stream advanced through the scaled layer
      ForwardContext context{comm, rows[static_cast<size_t>(w)].layout, &scale};
      student.layer_forward(context, layer, positions[static_cast<size_t>(w)], x[static_cast<size_t>(w)]);
    }
    if (progress) progress(layer + 1, c.num_layers);
  }
  return gamma;
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
