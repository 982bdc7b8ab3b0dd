// Golden values from HF transformers' torch_recurrent_gated_delta_rule and
// torch_chunk_gated_delta_rule (tests/fixtures/gen_gdn_golden.py): an independent implementation
// of the recurrence. Both hydra forms must match both HF forms. Tolerance 1e-5 relative (HF's two
// forms differ by ~2e-7 between themselves on these inputs).
#include "kernels/delta_rule/delta_rule.h"
#include "runtime/hdf5_file.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

TEST(DeltaRuleGolden, MatchesHuggingFace) {
  const H5File file = H5File::open_read(fixture_dir() + "/gdn_golden.h5");
  int cases = 0;
  for (const std::string group : {"t77_h3_d16", "t130_h2_d32_dv24", "t64_h1_d8", "t5_h2_d16"}) {
    auto read = [&](const std::string& name) { return file.read(group + "/" + name); };
    const Tensor q = read("q"), k = read("k"), v = read("v"), g = read("g"), beta = read("beta"), s0 = read("initial_state");
    const Tensor hf_rec = read("recurrent_out"), hf_chk = read("chunk_out"), hf_state = read("chunk_state");
    for (const bool chunked : {false, true}) {
      Tensor out = Tensor::empty(hf_rec.shape(), DType::f32), state = clone(s0);
      if (chunked) {
        ops::delta_rule_chunked(out, state, q, k, v, g, beta, {});
      } else {
        ops::delta_rule_recurrent(out, state, q, k, v, g, beta, {});
      }
      const std::string what = group + (chunked ? " chunked" : " recurrent");
      expect_close(out, hf_rec, 1e-5, what + " vs HF recurrent");
      expect_close(out, hf_chk, 1e-5, what + " vs HF chunk");
      expect_close(state, hf_state, 1e-5, what + " final state");
    }
    ++cases;
  }
  EXPECT_EQ(cases, 4);
}

}  // namespace
}  // namespace hydra::test
