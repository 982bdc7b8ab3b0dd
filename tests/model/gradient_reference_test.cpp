// Whole-model gradients against independent PyTorch float64 autograd implementations
// (tests/fixtures/gen_gradient_fixtures.py): a HydraHead model with a mixed FA/GDN layer, an
// all-GDN and an all-FA layer (the literal DESIGN.md §1.2 forward differentiated by autograd), and
// two Qwen3 teachers (Hugging Face's Qwen3ForCausalLM in float64; GQA untied, MHA tied). hydra runs
// its CPU path in float64 (fused projections, physical head order, chunked delta rule with its
// own backward, chunked cross-entropy), so the only differences are rounding: every parameter's
// gradient must agree to 1e-6 relative (‖g − g_ref‖ / ‖g_ref‖), the loss to 1e-9.
#include <cmath>

#include "model/hf_import.h"
#include "model/model.h"
#include "model/params.h"
#include "model/train/objective.h"
#include "parallel/self_communicator.h"
#include "runtime/hdf5_file.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

constexpr double kGradientTolerance = 1e-6;

void check_against_reference(const Model& model, const std::string& reference_file) {
  const H5File ref = H5File::open_read(reference_file);
  const Tensor ids_t = to(ref.read("input_ids"), Device::host, DType::i32);
  const std::vector<int32_t> ids(ids_t.data_as<int32_t>(), ids_t.data_as<int32_t>() + ids_t.numel());
  SelfCommunicator self;
  const train::NamedGradients g = train::next_token_gradients(self, model, ids);
  EXPECT_EQ(g.sums.tokens, static_cast<int64_t>(ids.size()) - 1);
  const double loss = g.sums.loss / static_cast<double>(g.sums.tokens), ref_loss = ref.double_attribute("loss");
  EXPECT_NEAR(loss, ref_loss, 1e-9 * std::abs(ref_loss)) << reference_file;
  // Every parameter has a gradient, and the reference has one for each (tied lm_head: none).
  EXPECT_EQ(g.grads.size(), ref.dataset_names().size() - 1) << "input_ids plus one dataset per parameter";
  double worst = 0;
  for (const auto& [name, grad] : g.grads) {
    ASSERT_TRUE(ref.has_dataset(name)) << name;
    ASSERT_EQ(count_non_finite(grad), 0) << name;
    const Tensor expected = ref.read(name);
    ASSERT_EQ(grad.numel(), expected.numel()) << name;
    const double err = norm_rel_error(grad, expected);
    EXPECT_LT(err, kGradientTolerance) << "gradient of " << name;
    worst = std::max(worst, err);
  }
  ::testing::Test::RecordProperty("max_gradient_rel_error", std::to_string(worst));
  std::printf("%s: loss %.9f (reference %.9f), worst gradient relative error %.3g over %zu tensors\n",
              reference_file.c_str(), loss, ref_loss, worst, g.grads.size());
}

TEST(GradientReference, HydraHeadMatchesTorchAutograd) {
  const std::string dir = fixture_dir() + "/hydra";
  const Model model = Model::load(dir + "/model.h5", Device::host, DType::f64);
  check_against_reference(model, dir + "/gradients.h5");
}

TEST(GradientReference, Qwen3TeachersMatchTransformersAutograd) {
  for (const char* name : {"gqa_untied", "mha_tied"}) {
    const std::string dir = fixture_dir() + "/hf/" + name;
    const LoadedCheckpoint ck = import_hf_checkpoint(dir);
    const Model model(ck.config, ck.params, Device::host, DType::f64);
    check_against_reference(model, dir + "/gradients.h5");
  }
}

}  // namespace
}  // namespace hydra::test
