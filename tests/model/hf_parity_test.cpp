// Parity with HF transformers' Qwen3ForCausalLM: every fixture written by
// tests/fixtures/gen_hf_qwen3_fixtures.py is imported through the HF importer (single-file,
// sharded, fp32/bf16/fp16 storage; GQA and MHA; tied and untied) and run through hydra's CPU forward.
// Tolerance 1e-4 relative (the import's acceptance bound): both sides compute in fp32; measured differences are ~1e-6.
#include <filesystem>

#include "model/hf_import.h"
#include "parallel/self_communicator.h"
#include "runtime/hdf5_file.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

class HfParity : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Fixtures, HfParity,
                         ::testing::Values("gqa_untied", "mha_tied", "gqa_sharded", "gqa_bf16", "mha_fp16"),
                         [](const auto& info) { return info.param; });

TEST_P(HfParity, LogitsMatchTransformers) {
  const std::string dir = fixture_dir() + "/hf/" + GetParam();
  const LoadedCheckpoint ck = import_hf_checkpoint(dir);
  const Model model(ck.config, ck.params);
  const H5File ref = H5File::open_read(dir + "/reference.h5");
  const Tensor ids64 = ref.read("input_ids"), expected = ref.read("logits");
  const int64_t t = ids64.size(0);
  Tensor ids = to(ids64, Device::host, DType::i32);
  SelfCommunicator self;
  ForwardContext context{self, SequenceLayout::zigzag(t, 1, 0)};
  const Tensor hidden = model.forward(context, ids);
  Tensor logits = Tensor::empty({t, ck.config.vocab_size}, DType::f32);
  model.lm_head(logits, hidden);
  expect_close(logits, expected, 1e-4, GetParam());
  RecordProperty("max_rel_error", std::to_string(max_rel_error(logits, expected)));
}

}  // namespace
}  // namespace hydra::test
