// HydraHead forward against an independent implementation: tests/fixtures/gen_hydra_reference.py
// writes DESIGN.md §1.2 literally in torch float64 (token-by-token delta rule, explicit τ, gate, conv,
// RoPE, L2 norm, fusion) for a model with a mixed FA/GDN layer, an all-GDN and an all-FA layer,
// and stores its checkpoint with h5py. Tolerance 1e-4 relative: hydra runs fp32 (chunked GDN,
// fused projections, physical head order) against fp64; measured ~1e-6.
#include "model/model.h"
#include "parallel/self_communicator.h"
#include "runtime/hdf5_file.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

TEST(HydraReference, LogitsMatchIndependentTorchImplementation) {
  const std::string dir = fixture_dir() + "/hydra";
  const Model model = Model::load(dir + "/model.h5");
  EXPECT_EQ(model.config().fa_heads_of(0), (std::vector<int>{0, 3}));
  EXPECT_TRUE(model.config().fa_heads_of(1).empty());
  EXPECT_EQ(model.config().fusion, ops::Fusion::scale_norm) << "a config without a fusion key (written before the variants)";
  const H5File ref = H5File::open_read(dir + "/reference.h5");
  const Tensor ids = to(ref.read("input_ids"), Device::host, DType::i32), expected = ref.read("logits");
  const int64_t t = ids.size(0);
  SelfCommunicator self;
  ForwardContext context{self, SequenceLayout::zigzag(t, 1, 0)};
  const Tensor hidden = model.forward(context, ids);
  Tensor logits = Tensor::empty({t, model.config().vocab_size}, DType::f32);
  model.lm_head(logits, hidden);
  expect_close(logits, expected, 1e-4, "hydrahead logits vs torch fp64 reference");
  RecordProperty("max_rel_error", std::to_string(max_rel_error(logits, expected)));
}

}  // namespace
}  // namespace hydra::test
