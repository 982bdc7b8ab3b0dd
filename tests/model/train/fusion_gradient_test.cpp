// The fusion variants (kernels/fusion/fusion.h) through the whole model: the next-token loss's
// gradient of every fusion tensor and of the tensors around it (W_o, the head projections, the
// input norm and the embedding, which the gate's x̂ path reaches) held to central finite differences
// in float64 on a tiny HydraHead model (mixed FA/GDN layers), for each variant. The gate's u are
// scaled up from their init so its x̂ path carries a visible share of those gradients.
// Tolerance: finite_differences.h.
#include <cmath>

#include "model/model.h"
#include "model/params.h"
#include "model/train/objective.h"
#include "parallel/self_communicator.h"
#include "runtime/random.h"
#include "tests/common/test_util.h"
#include "tests/model/train/finite_differences.h"

namespace hydra::test {
namespace {

double mean_loss(const ModelConfig& c, const NamedTensors& params, const std::vector<int32_t>& ids) {
  const Model model(c, params, Device::host, DType::f64);
  SelfCommunicator self;
  const train::NamedGradients g = train::next_token_gradients(self, model, ids);
  return g.sums.loss / static_cast<double>(g.sums.tokens);
}

class FusionGradient : public ::testing::TestWithParam<ops::Fusion> {};

TEST_P(FusionGradient, MatchesFiniteDifferences) {
  ModelConfig c = preset_config("hydrahead-tiny");
  c.fusion = GetParam();
  const int64_t t = 24;
  const std::vector<int32_t> ids = sequence(t, c.vocab_size);
  NamedTensors params = f64_parameters(c, 9);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string u = layer_prefix(l) + "self_attn.fuse_gate.weight";
    if (!params.count(u)) continue;
    Tensor& w = params.at(u);
    for (int64_t i = 0; i < w.numel(); ++i) w.data_as<double>()[i] *= 40.0;
  }
  const Model model(c, params, Device::host, DType::f64);
  SelfCommunicator self;
  const train::NamedGradients g = train::next_token_gradients(self, model, ids);
  std::vector<std::string> names = {"model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                                    "model.layers.1.input_layernorm.weight", "model.layers.1.self_attn.o_proj.weight",
                                    "model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.gdn_v_proj.weight"};
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (const char* p : {"self_attn.fuse_norm.weight", "self_attn.fuse_gamma", "self_attn.fuse_gate.weight",
                          "self_attn.fuse_gate.bias"}) {
      const std::string name = layer_prefix(l) + p;
      const bool has = params.count(name) > 0;
      const bool expected = std::string(p) == "self_attn.fuse_norm.weight" ? ops::fusion_has_norm(c.fusion)
                            : std::string(p) == "self_attn.fuse_gamma"     ? ops::fusion_has_gamma(c.fusion)
                                                                           : ops::fusion_has_gate(c.fusion);
      EXPECT_EQ(has, expected) << name << " for fusion " << ops::fusion_name(c.fusion);
      if (has) names.push_back(name);
    }
  }
  expect_gradients_match_finite_differences(params, g.grads, names, 3, RandomStream{17, 5},
                                            [&](const NamedTensors& p) { return mean_loss(c, p, ids); });
}

INSTANTIATE_TEST_SUITE_P(Variants, FusionGradient, ::testing::ValuesIn(ops::kFusions),
                         [](const ::testing::TestParamInfo<ops::Fusion>& info) {
                           return std::string(ops::fusion_name(info.param));
                         });

// The gate's x̂ path is on input_layernorm's gradient: setting u to 0 changes it (the finite
// differences above hold its value with u ≠ 0); u's own gradient is not zero at u = 0 (where a
// converted student starts).
TEST(FusionGradient, GateReachesTheInputNorm) {
  ModelConfig c = preset_config("hydrahead-tiny");
  c.fusion = ops::Fusion::gate;
  const std::vector<int32_t> ids = sequence(20, c.vocab_size);
  NamedTensors with_u = f64_parameters(c, 9), without_u = with_u;
  const std::string u = layer_prefix(0) + "self_attn.fuse_gate.weight";
  without_u[u] = Tensor::zeros(with_u.at(u).shape(), DType::f64);
  SelfCommunicator self;
  const auto grads = [&](const NamedTensors& p) {
    return train::next_token_gradients(self, Model(c, p, Device::host, DType::f64), ids).grads;
  };
  const NamedTensors a = grads(with_u), b = grads(without_u);
  EXPECT_GT(norm_rel_error(a.at(layer_prefix(0) + "input_layernorm.weight"),
                           b.at(layer_prefix(0) + "input_layernorm.weight")),
            1e-6);
  // u's own gradient is there with u = 0 too (the converted student's starting point).
  double norm = 0;
  for (int64_t i = 0; i < b.at(u).numel(); ++i) norm += std::abs(b.at(u).data_as<double>()[i]);
  EXPECT_GT(norm, 0.0);
}

}  // namespace
}  // namespace hydra::test
