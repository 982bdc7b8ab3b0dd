// Loss masks (DESIGN.md §1.5, runtime/token_file.h loss_mask): the masked mean next-token loss and its
// gradient, held to central finite differences of that same masked mean in float64 on a tiny
// HydraHead model (mixed FA/GDN layers), and the edge cases: a mask of all ones is no mask, a
// target outside the mask changes neither the loss nor the gradient, a window with nothing counted
// gives zero loss and zero gradient without dividing by zero.
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

// Counts targets 3, 4, 9, 10, 11 and every 7th: a mask with runs and gaps, position 0 set (never a target).
std::vector<uint8_t> some_mask(int64_t t) {
  std::vector<uint8_t> m(static_cast<size_t>(t), 0);
  for (int64_t i = 0; i < t; ++i) m[static_cast<size_t>(i)] = (i == 0 || i == 3 || i == 4 || (i >= 9 && i <= 11) || i % 7 == 0) ? 1 : 0;
  return m;
}

double masked_mean_loss(const ModelConfig& c, const NamedTensors& params, const std::vector<int32_t>& ids,
                        const std::vector<uint8_t>& mask) {
  const Model model(c, params, Device::host, DType::f64);
  SelfCommunicator self;
  const train::NamedGradients g = train::next_token_gradients(self, model, ids, mask);
  return g.sums.loss / static_cast<double>(g.sums.tokens);
}

TEST(MaskedLoss, GradientMatchesFiniteDifferencesOfTheMaskedMean) {
  const ModelConfig c = preset_config("hydrahead-tiny");
  const int64_t t = 40;
  const std::vector<int32_t> ids = sequence(t, c.vocab_size);
  const std::vector<uint8_t> mask = some_mask(t);
  const NamedTensors params = f64_parameters(c, 5);
  const Model model(c, params, Device::host, DType::f64);
  SelfCommunicator self;
  const train::NamedGradients g = train::next_token_gradients(self, model, ids, mask);
  int64_t counted = 0;
  for (int64_t i = 1; i < t; ++i) counted += mask[static_cast<size_t>(i)];
  ASSERT_EQ(g.sums.tokens, counted);
  // A few entries of tensors on every path: embedding, a GDN gate, the fused FA/GDN projections, the
  // MLP, lm_head.
  const std::vector<std::string> names = {"model.embed_tokens.weight", "model.layers.0.self_attn.gdn_A_log",
                                          "model.layers.1.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight",
                                          "model.layers.1.self_attn.fa_gate_proj.weight",
                                          "model.layers.0.self_attn.gdn_k_conv.weight"};
  expect_gradients_match_finite_differences(params, g.grads, names, 3, RandomStream{11, 3},
                                            [&](const NamedTensors& p) { return masked_mean_loss(c, p, ids, mask); });
}

TEST(MaskedLoss, AllOnesIsNoMaskAndUncountedTargetsDoNotMatter) {
  const ModelConfig c = preset_config("hydrahead-tiny");
  const int64_t t = 33;
  const std::vector<int32_t> ids = sequence(t, c.vocab_size);
  const Model model(c, random_parameters(c, 6), Device::host, DType::f64);
  SelfCommunicator self;
  const train::NamedGradients plain = train::next_token_gradients(self, model, ids);
  const train::NamedGradients ones = train::next_token_gradients(self, model, ids, std::vector<uint8_t>(ids.size(), 1));
  EXPECT_EQ(ones.sums.tokens, plain.sums.tokens);
  EXPECT_EQ(ones.sums.loss, plain.sums.loss);
  for (const auto& [n, gr] : plain.grads) EXPECT_EQ(norm_rel_error(ones.grads.at(n), gr), 0.0) << n;
  // Changing a token that is only a masked-out target (the last one, which nothing reads) changes nothing.
  std::vector<uint8_t> mask = some_mask(t);
  mask.back() = 0;
  std::vector<int32_t> other = ids;
  other.back() = (other.back() + 1) % static_cast<int32_t>(c.vocab_size);
  const train::NamedGradients a = train::next_token_gradients(self, model, ids, mask);
  const train::NamedGradients b = train::next_token_gradients(self, model, other, mask);
  EXPECT_EQ(a.sums.loss, b.sums.loss);
  for (const auto& [n, gr] : a.grads) EXPECT_EQ(norm_rel_error(b.grads.at(n), gr), 0.0) << n;
}

TEST(MaskedLoss, NothingCountedGivesZeroWithoutDividingByZero) {
  const ModelConfig c = preset_config("qwen3-tiny");
  const std::vector<int32_t> ids = sequence(17, c.vocab_size);
  std::vector<uint8_t> mask(ids.size(), 0);
  mask[0] = 1;  // position 0 is never a target: still nothing counted
  const Model model(c, random_parameters(c, 7), Device::host, DType::f64);
  SelfCommunicator self;
  const train::NamedGradients g = train::next_token_gradients(self, model, ids, mask);
  EXPECT_EQ(g.sums.tokens, 0);
  EXPECT_EQ(g.sums.loss, 0.0);
  for (const auto& [n, gr] : g.grads) {
    ASSERT_EQ(count_non_finite(gr), 0) << n;
    double norm = 0;
    for (int64_t i = 0; i < gr.numel(); ++i) norm += std::abs(gr.data_as<double>()[i]);
    EXPECT_EQ(norm, 0.0) << n;
  }
}

}  // namespace
}  // namespace hydra::test
