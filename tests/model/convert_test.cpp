// Conversion (DESIGN.md §1.3): migrated tensors are bit-identical copies, GDN K/V rows are their KV
// group's rows, new parameters follow their distributions and the seed, γ equals the measured RMS
// of each teacher head's output, and head-set specs resolve as documented.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>

#include "model/convert.h"
#include "model/fa_heads_file.h"
#include "model/params.h"
#include "parallel/self_communicator.h"
#include "runtime/token_file.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

ModelConfig teacher_config() {
  ModelConfig c = preset_config("qwen3-tiny");
  c.num_heads = 6;  // G = 2: groups {0,1,2} -> 0, {3,4,5} -> 1
  c.num_layers = 3;
  return c;
}

void expect_identical(const Tensor& a, const TensorView& b, const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  const Tensor bc = clone(b);
  EXPECT_EQ(std::memcmp(a.data(), bc.data(), a.nbytes()), 0) << what << " is not a bit-identical copy";
}

TEST(Convert, MigratesParametersAsSpecified) {
  const ModelConfig tc = teacher_config();
  const NamedTensors teacher = random_parameters(tc, 3);
  const ModelConfig sc = student_config(tc, {{4}, {0, 1, 2, 3, 4, 5}, {}});  // mixed, all-FA, all-GDN
  const NamedTensors s = convert_parameters(tc, teacher, sc, 9, {});
  const int64_t d = tc.head_dim;
  double sum_sq = 0;  // w_a, w_b over all layers
  int64_t draws = 0;
  for (const char* name : {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}) {
    expect_identical(s.at(name), teacher.at(name), name);
  }
  for (int64_t l = 0; l < tc.num_layers; ++l) {
    const std::string p = layer_prefix(l);
    for (const char* name : {"input_layernorm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
                             "mlp.up_proj.weight", "mlp.down_proj.weight", "self_attn.o_proj.weight",
                             "self_attn.q_proj.weight"}) {
      expect_identical(s.at(p + name), teacher.at(p + name), p + name);
    }
    const std::vector<int> fa = sc.fa_heads_of(l), gdn = sc.gdn_heads_of(l), fa_kv = sc.fa_kv_heads_of(l);
    if (!fa.empty()) {
      for (const char* name : {"self_attn.q_norm.weight", "self_attn.k_norm.weight"}) {
        expect_identical(s.at(p + name), teacher.at(p + name), p + name);
      }
      for (size_t i = 0; i < fa_kv.size(); ++i) {
        for (const char* kv : {"self_attn.k_proj.weight", "self_attn.v_proj.weight"}) {
          expect_identical(clone(s.at(p + kv).view().narrow(0, static_cast<int64_t>(i) * d, d)),
                           teacher.at(p + kv).view().narrow(0, fa_kv[i] * d, d), p + kv + " FA group");
        }
      }
      for (int64_t i = 0; i < s.at(p + "self_attn.fa_gate_proj.weight").numel(); ++i) {
        EXPECT_EQ(s.at(p + "self_attn.fa_gate_proj.weight").data_as<float>()[i], 0.0f);
      }
    } else {
      EXPECT_EQ(s.count(p + "self_attn.k_proj.weight"), 0u);
    }
    for (size_t i = 0; i < gdn.size(); ++i) {
      const int64_t g = tc.kv_head_of(gdn[i]);
      expect_identical(clone(s.at(p + "self_attn.gdn_k_proj.weight").view().narrow(0, static_cast<int64_t>(i) * d, d)),
                       teacher.at(p + "self_attn.k_proj.weight").view().narrow(0, g * d, d), p + "gdn_k_proj head");
      expect_identical(clone(s.at(p + "self_attn.gdn_v_proj.weight").view().narrow(0, static_cast<int64_t>(i) * d, d)),
                       teacher.at(p + "self_attn.v_proj.weight").view().narrow(0, g * d, d), p + "gdn_v_proj head");
    }
    if (!gdn.empty()) {
      const Tensor& conv = s.at(p + "self_attn.gdn_q_conv.weight");
      for (int64_t ch = 0; ch < conv.size(0); ++ch)
        for (int64_t m = 0; m < conv.size(1); ++m) EXPECT_EQ(conv.data_as<float>()[ch * 4 + m], m == 3 ? 1.0f : 0.0f);
      const Tensor& alog = s.at(p + "self_attn.gdn_A_log");
      const Tensor& dtb = s.at(p + "self_attn.gdn_dt_bias");
      for (int64_t i = 0; i < alog.numel(); ++i) {
        EXPECT_GE(std::exp(alog.data_as<float>()[i]), 1.0f - 1e-5f);
        EXPECT_LE(std::exp(alog.data_as<float>()[i]), 16.0f + 1e-4f);
        const float dt = std::log1p(std::exp(dtb.data_as<float>()[i]));
        EXPECT_GE(dt, 0.999e-3f);
        EXPECT_LE(dt, 0.1001f);
      }
      for (const char* w : {"self_attn.gdn_a_proj.weight", "self_attn.gdn_b_proj.weight"}) {
        const Tensor& t = s.at(p + w);
        for (int64_t i = 0; i < t.numel(); ++i) {
          sum_sq += std::pow(t.data_as<float>()[i], 2);
          ++draws;
        }
      }
    }
    for (int64_t i = 0; i < s.at(p + "self_attn.fuse_norm.weight").numel(); ++i) {
      EXPECT_EQ(s.at(p + "self_attn.fuse_norm.weight").data_as<float>()[i], 1.0f);
    }
  }
  // w_a, w_b ~ N(0, 0.02²): over ~1400 draws the sample std is within 10% of 0.02 (~5 sigma).
  EXPECT_GT(draws, 1000);
  EXPECT_NEAR(std::sqrt(sum_sq / static_cast<double>(draws)), 0.02, 0.002);
  // Seeded: same seed, same student; another seed changes only the random GDN parameters.
  const NamedTensors again = convert_parameters(tc, teacher, sc, 9, {}), other = convert_parameters(tc, teacher, sc, 10, {});
  for (const auto& [name, t] : s) expect_identical(t, again.at(name), name + " (same seed)");
  EXPECT_GT(max_rel_error(other.at("model.layers.0.self_attn.gdn_b_proj.weight"), s.at("model.layers.0.self_attn.gdn_b_proj.weight")), 0.1);
}

// Independent measurement of per-head output RMS: fp64 sums over a captured copy.
class CaptureHeads final : public LayerObserver {
 public:
  void on_head_outputs(int64_t layer, const TensorView& o, std::span<const int> head_of) override {
    Tensor host = clone(o);
    for (size_t p = 0; p < head_of.size(); ++p) {
      double ss = 0;
      for (int64_t t = 0; t < host.size(0); ++t)
        for (int64_t c = 0; c < host.size(2); ++c) ss += std::pow(*static_cast<float*>(host.view().element_ptr({t, static_cast<int64_t>(p), c})), 2);
      rms[{layer, head_of[p]}] = std::sqrt(ss / static_cast<double>(host.size(0) * host.size(2)));
    }
  }
  std::map<std::pair<int64_t, int>, double> rms;
};

TEST(Convert, GammaIsTheTeachersMeasuredHeadRms) {
  const ModelConfig tc = teacher_config();
  const NamedTensors teacher = random_parameters(tc, 4);
  std::vector<int32_t> tokens(150);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 31 + 7) % tc.vocab_size);
  const Model model(tc, teacher);
  SelfCommunicator self;
  const auto gamma = measure_head_rms(model, self, tokens);
  CaptureHeads capture;
  ForwardContext context{self, SequenceLayout::zigzag(150, 1, 0), &capture};
  model.forward(context, TensorView(tokens.data(), DType::i32, Device::host, {150}));
  const ModelConfig sc = student_config(tc, resolve_fa_heads("uniform:2", tc, ""));
  const NamedTensors s = convert_parameters(tc, teacher, sc, 1, gamma);
  for (int64_t l = 0; l < tc.num_layers; ++l)
    for (int h = 0; h < tc.num_heads; ++h) {
      const double expected = capture.rms.at({l, h});
      EXPECT_GT(expected, 0.0);
      EXPECT_NEAR(s.at(layer_prefix(l) + "self_attn.fuse_gamma").data_as<float>()[h], expected, 1e-5 * expected)
          << "layer " << l << " head " << h;
    }
  // The converted model runs: finite and deterministic.
  const Model student(sc, s);
  ForwardContext sctx{self, SequenceLayout::zigzag(150, 1, 0)};
  const TensorView ids(tokens.data(), DType::i32, Device::host, {150});
  const Tensor a = student.forward(sctx, ids), b = student.forward(sctx, ids);
  EXPECT_EQ(count_non_finite(a), 0);
  EXPECT_EQ(max_rel_error(a, b), 0.0);
}

// Each fusion variant's student has its tensors and no others; the gate's u and b start at 0, so a
// converted gate student computes what the scale_norm student does.
TEST(Convert, FusionVariantsHaveTheirTensorsAndGateStartsAsScaleNorm) {
  const ModelConfig tc = teacher_config();
  const NamedTensors teacher = random_parameters(tc, 3);
  const std::vector<std::vector<int>> heads = {{4}, {0, 1, 2, 3, 4, 5}, {}};
  std::map<ops::Fusion, Tensor> logits;
  std::vector<int32_t> tokens(40);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 31 + 7) % tc.vocab_size);
  for (const ops::Fusion fusion : ops::kFusions) {
    const ModelConfig sc = student_config(tc, heads, fusion);
    EXPECT_EQ(sc.fusion, fusion);
    const NamedTensors s = convert_parameters(tc, teacher, sc, 9, {});
    for (int64_t l = 0; l < tc.num_layers; ++l) {
      const std::string p = layer_prefix(l) + "self_attn.";
      EXPECT_EQ(s.count(p + "fuse_norm.weight") > 0, ops::fusion_has_norm(fusion)) << ops::fusion_name(fusion);
      EXPECT_EQ(s.count(p + "fuse_gamma") > 0, ops::fusion_has_gamma(fusion)) << ops::fusion_name(fusion);
      EXPECT_EQ(s.count(p + "fuse_gate.weight") > 0, ops::fusion_has_gate(fusion)) << ops::fusion_name(fusion);
      EXPECT_EQ(s.count(p + "fuse_gate.bias") > 0, ops::fusion_has_gate(fusion)) << ops::fusion_name(fusion);
      if (ops::fusion_has_gate(fusion)) {
        EXPECT_EQ(s.at(p + "fuse_gate.weight").shape_string(), fmt::format("[{}, {}]", tc.num_heads, tc.hidden_size));
        EXPECT_EQ(s.at(p + "fuse_gate.bias").shape_string(), fmt::format("[{}]", tc.num_heads));
        for (const char* name : {"fuse_gate.weight", "fuse_gate.bias"}) {
          const Tensor& t = s.at(p + name);
          for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.data_as<float>()[i], 0.0f) << p + name;
        }
      }
    }
    logits[fusion] = full_logits(Model(sc, s), tokens);
    EXPECT_EQ(count_non_finite(logits[fusion]), 0) << ops::fusion_name(fusion);
  }
  // fp32, the same arithmetic but for the gate's factor 2σ(0) = 1 and a wider projection GEMM.
  expect_close(logits[ops::Fusion::gate], logits[ops::Fusion::scale_norm], 1e-6, "gate student vs scale_norm student");
  EXPECT_GT(max_rel_error(logits[ops::Fusion::concat], logits[ops::Fusion::scale_norm]), 1e-3)
      << "the variants compute different models";
  // A checkpoint whose tensors are another variant's is refused, naming the fusion.
  const ModelConfig gate = student_config(tc, heads, ops::Fusion::gate);
  const NamedTensors plain = convert_parameters(tc, teacher, student_config(tc, heads), 9, {});
  EXPECT_EQ(error_of([&] { validate_parameters(gate, plain, "s.h5"); }),
            "s.h5: tensor 'model.layers.0.self_attn.fuse_gate.weight' is missing (the config's fusion is gate)");
  const ModelConfig concat = student_config(tc, heads, ops::Fusion::concat);
  EXPECT_EQ(error_of([&] { validate_parameters(concat, plain, "s.h5"); }),
            "s.h5: unexpected tensor 'model.layers.0.self_attn.fuse_gamma' for this config (the config's fusion is concat)");
}

// `scale`: γ_h = the teacher's head RMS over the student's own, layer by layer, so every scaled
// head output has the teacher's RMS over the calibration tokens.
TEST(Convert, ScaleGammaMatchesTheTeachersHeadScale) {
  const ModelConfig tc = teacher_config();
  const NamedTensors teacher = random_parameters(tc, 4);
  std::vector<int32_t> tokens(150);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 31 + 7) % tc.vocab_size);
  SelfCommunicator self;
  const auto teacher_rms = measure_head_rms(Model(tc, teacher), self, tokens);
  const ModelConfig sc = student_config(tc, resolve_fa_heads("uniform:2", tc, ""), ops::Fusion::scale);
  const Model unscaled(sc, convert_parameters(tc, teacher, sc, 1, {}));
  const auto own = measure_head_rms(unscaled, self, tokens);
  const auto gamma = calibrate_scale_gamma(unscaled, self, tokens, teacher_rms);
  const NamedTensors s = convert_parameters(tc, teacher, sc, 1, gamma);
  CaptureHeads capture;  // the scaled student's fused outputs
  ForwardContext context{self, SequenceLayout::zigzag(150, 1, 0), &capture};
  Model(sc, s).forward(context, TensorView(tokens.data(), DType::i32, Device::host, {150}));
  for (int64_t l = 0; l < tc.num_layers; ++l)
    for (int h = 0; h < tc.num_heads; ++h) {
      const double expected = teacher_rms[l][h];
      EXPECT_GT(std::abs(own[l][h] - expected), 1e-3 * expected) << "the student's own scale differs (γ is not trivially 1)";
      EXPECT_NEAR(s.at(layer_prefix(l) + "self_attn.fuse_gamma").data_as<float>()[h], gamma[l][h], 1e-6 * gamma[l][h]);
      EXPECT_NEAR(capture.rms.at({l, h}), expected, 1e-4 * expected) << "layer " << l << " head " << h;
    }
}

// Σ o² per (layer, head) over every call (fp64): several forwards add up.
class SquareSums final : public LayerObserver {
 public:
  void on_head_outputs(int64_t layer, const TensorView& o, std::span<const int> head_of) override {
    Tensor host = clone(o);
    for (size_t p = 0; p < head_of.size(); ++p)
      for (int64_t t = 0; t < host.size(0); ++t)
        for (int64_t c = 0; c < host.size(2); ++c)
          sums[{layer, head_of[p]}] += std::pow(*static_cast<float*>(host.view().element_ptr({t, static_cast<int64_t>(p), c})), 2);
  }
  std::map<std::pair<int64_t, int>, double> sums;
};

// convert --calib in windows: the stream cut into windows of --calib-seq-len, capped by
// --calib-tokens, every document inside a window running alone; γ is the RMS over exactly those
// tokens, as separate forwards of each window's pieces give it (at 6777ccb one forward ran over the
// whole file as one sequence, ignoring document_offsets, quadratic in its length).
TEST(Convert, CalibrationWindowsRespectDocumentsAndTheCap) {
  const ModelConfig tc = teacher_config();
  const NamedTensors teacher = random_parameters(tc, 4);
  std::vector<int32_t> tokens(170);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37 + 11) % tc.vocab_size);
  TempDir dir;
  write_token_data(dir.file("calib.h5"), tokens, {}, {0, 40, 100, 130, 170});
  // Windows of 50, at most 160 tokens: three windows (150 tokens); documents start at 40 (window 0),
  // 100 (window 2's start: nothing inside) and 130 (window 2 at 30).
  const CalibrationWindows c = read_calibration_windows(dir.file("calib.h5"), tc.vocab_size, 50, 160, 1);
  ASSERT_EQ(c.windows, 3);
  EXPECT_EQ(c.seq_len, 50);
  EXPECT_EQ(c.document_starts[0], (std::vector<int64_t>{0, 40}));
  EXPECT_TRUE(c.document_starts[1].empty());
  EXPECT_EQ(c.document_starts[2], (std::vector<int64_t>{0, 30}));
  const Model model(tc, teacher);
  SelfCommunicator self;
  int64_t progress = 0;
  const auto gamma = measure_head_rms(model, self, c, [&](int64_t done, int64_t total) {
    EXPECT_EQ(total, 3);
    progress = done;
  });
  EXPECT_EQ(progress, 3);
  SquareSums capture;  // each document piece alone: [0,40) [40,50) [50,100) [100,130) [130,150)
  for (const auto& [a, b] : std::vector<std::pair<int, int>>{{0, 40}, {40, 50}, {50, 100}, {100, 130}, {130, 150}}) {
    ForwardContext context{self, SequenceLayout::zigzag(b - a, 1, 0), &capture};
    model.forward(context, TensorView(tokens.data() + a, DType::i32, Device::host, {b - a}));
  }
  for (int64_t l = 0; l < tc.num_layers; ++l)
    for (int h = 0; h < tc.num_heads; ++h) {
      const double expected = std::sqrt(capture.sums.at({l, h}) / (150.0 * static_cast<double>(tc.head_dim)));
      EXPECT_NEAR(gamma[l][h], expected, 1e-5 * expected) << "layer " << l << " head " << h;
    }
  // The scale fusion's layer-by-layer calibration over windows: each scaled head has the teacher's RMS.
  const ModelConfig sc = student_config(tc, resolve_fa_heads("uniform:2", tc, ""), ops::Fusion::scale);
  const Model unscaled(sc, convert_parameters(tc, teacher, sc, 1, {}));
  const auto scale = calibrate_scale_gamma(unscaled, self, c, gamma);
  const Model scaled(sc, convert_parameters(tc, teacher, sc, 1, scale));
  const auto own = measure_head_rms(scaled, self, c);
  for (int64_t l = 0; l < tc.num_layers; ++l)
    for (int h = 0; h < tc.num_heads; ++h) EXPECT_NEAR(own[l][h], gamma[l][h], 1e-4 * gamma[l][h]) << l << " " << h;
  // A stream shorter than a window: one window of what there is (on 2 ranks, a multiple of 4).
  const CalibrationWindows short_one = read_calibration_windows(dir.file("calib.h5"), tc.vocab_size, 4096, 0, 2);
  EXPECT_EQ(short_one.windows, 1);
  EXPECT_EQ(short_one.seq_len, 168);
  EXPECT_NE(error_of([&] { read_calibration_windows(dir.file("calib.h5"), tc.vocab_size, 50, 0, 2); })
                .find("--calib-seq-len 50 must be a multiple of 4 on 2 ranks"),
            std::string::npos);
}

TEST(FaHeadSpecs, ResolveAsDocumented) {
  ModelConfig tc = teacher_config();
  tc.num_layers = 8;
  EXPECT_EQ(resolve_fa_heads("uniform:2", tc, "")[5], (std::vector<int>{0, 1}));
  const auto lw = resolve_fa_heads("layerwise:4", tc, "");
  for (int64_t l = 0; l < 8; ++l) EXPECT_EQ(lw[l].size(), (l == 3 || l == 7) ? 6u : 0u) << l;
  TempDir dir;
  FaHeadsFile f;
  f.fa_heads.assign(8, {5});
  f.scores["composite"].assign(8, {0.1, 0.9, 0.3, 0.9, 0.0, 0.2});
  write_fa_heads_file(dir.file("heads.json"), tc, f);
  EXPECT_EQ(resolve_fa_heads("file:" + dir.file("heads.json"), tc, "")[2], (std::vector<int>{5}));
  EXPECT_EQ(resolve_fa_heads("uniform:3", tc, dir.file("heads.json"))[0], (std::vector<int>{1, 2, 3}));
  EXPECT_NE(error_of([&] { resolve_fa_heads("uniform:7", tc, ""); }).find("budget of 7 FA heads per layer is not in 0..6"),
            std::string::npos);
  f.fa_heads[6] = {6};
  write_fa_heads_file(dir.file("bad.json"), tc, f);
  EXPECT_NE(error_of([&] { resolve_fa_heads("file:" + dir.file("bad.json"), tc, ""); }).find("layer 6 names head 6, but the model's heads are 0..5"),
            std::string::npos);
  f.fa_heads.resize(5);
  f.scores.clear();
  write_fa_heads_file(dir.file("short.json"), tc, f);
  EXPECT_NE(error_of([&] { resolve_fa_heads("file:" + dir.file("short.json"), tc, ""); }).find("lists 5 layers, the model has 8"),
            std::string::npos);
  EXPECT_NE(error_of([&] { resolve_fa_heads("uniform:x", tc, ""); }).find("K must be an integer"), std::string::npos);
  EXPECT_NE(error_of([&] { resolve_fa_heads("bogus:3", tc, ""); }).find("unknown kind 'bogus'"), std::string::npos);
  // random:K: K distinct heads per layer, a function of the seed, not the same in every layer.
  const auto r = resolve_fa_heads("random:2", tc, "", 5);
  EXPECT_EQ(r, resolve_fa_heads("random:2", tc, "", 5));
  EXPECT_NE(r, resolve_fa_heads("random:2", tc, "", 6));
  bool layers_differ = false;
  for (const auto& heads : r) {
    ASSERT_EQ(heads.size(), 2u);
    EXPECT_LT(heads[0], heads[1]);
    EXPECT_TRUE(heads[0] >= 0 && heads[1] < tc.num_heads);
    layers_differ = layers_differ || heads != r[0];
  }
  EXPECT_TRUE(layers_differ);
  EXPECT_EQ(resolve_fa_heads("random:0", tc, "", 5)[3], std::vector<int>{});
  EXPECT_NE(error_of([&] { resolve_fa_heads("random:7", tc, ""); }).find("7 random FA heads per layer is not in 0..6"),
            std::string::npos);
  EXPECT_NE(error_of([&] { student_config(preset_config("hydrahead-tiny"), {{0}, {1}}); }).find("teacher must be a qwen3"),
            std::string::npos);
}

// Head sets over the whole model: exact sets for a known score file, the seed's draw, bad specs.
TEST(FaHeadSpecs, GlobalSetsOverTheWholeModel) {
  ModelConfig tc = teacher_config();  // 6 heads per layer
  tc.num_layers = 4;
  TempDir dir;
  FaHeadsFile f;
  f.fa_heads.assign(4, {});
  // composite[l][h]: layer 2 holds the three highest; layer 0 the two lowest; ties at 0.5 in layers 1 and 3.
  f.scores["composite"] = {{-2.0, 0.1, 0.2, -1.0, 0.3, 0.4},
                           {0.5, 0.6, 0.7, 0.8, 0.9, 0.5},
                           {3.0, 1.0, 2.0, 5.0, 0.95, 0.96},
                           {0.5, 0.55, 0.65, 0.75, 0.85, 0.45}};
  const std::string scores = dir.file("scores.json");
  write_fa_heads_file(scores, tc, f);
  using Sets = std::vector<std::vector<int>>;
  EXPECT_EQ(resolve_fa_heads("top-global:1", tc, scores), (Sets{{}, {}, {3}, {}}));
  EXPECT_EQ(resolve_fa_heads("top-global:4", tc, scores), (Sets{{}, {}, {0, 1, 2, 3}, {}}));
  EXPECT_EQ(resolve_fa_heads("top-global:7", tc, scores), (Sets{{}, {4}, {0, 1, 2, 3, 4, 5}, {}}));
  EXPECT_EQ(resolve_fa_heads("bottom-global:2", tc, scores), (Sets{{0, 3}, {}, {}, {}}));
  // 0.45 (3,5) < then 0.5 at (1,0), (1,5), (3,0): ties keep the lower (layer, head).
  EXPECT_EQ(resolve_fa_heads("bottom-global:8", tc, scores), (Sets{{0, 1, 2, 3, 4, 5}, {0}, {}, {5}}));
  EXPECT_EQ(resolve_fa_heads("top-global:0", tc, scores), (Sets{{}, {}, {}, {}}));
  EXPECT_EQ(resolve_fa_heads("top-global:24", tc, scores), resolve_fa_heads("uniform:6", tc, ""));
  // random-global:K: K distinct heads anywhere, a function of the seed alone.
  const Sets r = resolve_fa_heads("random-global:5", tc, "", 11);
  EXPECT_EQ(r, resolve_fa_heads("random-global:5", tc, "", 11));
  EXPECT_NE(r, resolve_fa_heads("random-global:5", tc, "", 12));
  size_t count = 0;
  for (const auto& heads : r) {
    count += heads.size();
    EXPECT_TRUE(std::is_sorted(heads.begin(), heads.end()));
    EXPECT_EQ(std::adjacent_find(heads.begin(), heads.end()), heads.end());
  }
  EXPECT_EQ(count, 5u);
  EXPECT_EQ(resolve_fa_heads("random-global:5@11", tc, "", 3), r);  // @DRAW replaces the seed
  // Over many seeds a single head lands in every (layer, head) about equally often (uniform draw):
  // 2400 draws, 24 cells, expected 100 each; a binomial's 5-sigma band is 100 +- 49.
  std::vector<int> hits(24, 0);
  for (uint64_t seed = 0; seed < 2400; ++seed) {
    const Sets one = resolve_fa_heads("random-global:1", tc, "", seed);
    for (size_t l = 0; l < one.size(); ++l)
      for (int h : one[l]) ++hits[l * 6 + static_cast<size_t>(h)];
  }
  for (size_t c = 0; c < hits.size(); ++c) EXPECT_TRUE(hits[c] > 51 && hits[c] < 149) << "cell " << c << ": " << hits[c];
  // layerwise:EVERY@OFFSET places the FA layer; layerwise:EVERY stays at EVERY-1.
  EXPECT_EQ(resolve_fa_heads("layerwise:2@0", tc, "")[0].size(), 6u);
  EXPECT_EQ(resolve_fa_heads("layerwise:2@0", tc, "")[1].size(), 0u);
  EXPECT_EQ(resolve_fa_heads("layerwise:2@0", tc, "")[2].size(), 6u);
  EXPECT_EQ(resolve_fa_heads("layerwise:4@2", tc, ""), (Sets{{}, {}, {0, 1, 2, 3, 4, 5}, {}}));
  EXPECT_EQ(resolve_fa_heads("layerwise:4", tc, ""), resolve_fa_heads("layerwise:4@3", tc, ""));
  // Bad specs: one line naming the problem.
  const auto fails_with = [&](const std::string& spec, const std::string& scores_path, const std::string& text) {
    const std::string e = error_of([&] { resolve_fa_heads(spec, tc, scores_path); });
    EXPECT_NE(e.find(text), std::string::npos) << spec << ": " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << spec << ": " << e;
  };
  fails_with("top-global:2", "", "ranks heads by score: give --scores FILE");
  fails_with("bottom-global:1", "", "ranks heads by score: give --scores FILE");
  fails_with("top-global:25", scores, "a budget of 25 FA heads over the whole model is not in 0..24 (4 layers x 6 heads)");
  fails_with("random-global:-1", "", "not in 0..24");
  fails_with("random-global:two", "", "K must be an integer");
  fails_with("random-global:2", scores, "--scores only applies to");
  fails_with("layerwise:4@4", "", "OFFSET must be in 0..3");
  fails_with("random-global:2@-3", "", "DRAW must be 0 or more");
  fails_with("random-global:2@x", "", "DRAW must be an integer");
  fails_with("layerwise:4@", "", "OFFSET must be an integer");
  fails_with("layerwise:5@0", "", "EVERY must be in 1..4");
  FaHeadsFile no_scores;
  no_scores.fa_heads.assign(4, {});
  write_fa_heads_file(dir.file("plain.json"), tc, no_scores);
  fails_with("top-global:1", dir.file("plain.json"), "no scores.composite to rank heads by");
}

}  // namespace
}  // namespace hydra::test
