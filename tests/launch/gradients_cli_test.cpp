// hydra gradients as a user runs it: the file it writes holds the mean next-token loss and every
// parameter's gradient under its checkpoint name, equal to the library's (train::
// next_token_gradients) on one rank and under mpirun on 2 ranks (zigzag; 1e-5, fp32 summation
// order); bad input is a one-line error (exit 2) and writes nothing.
#include <filesystem>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/model.h"
#include "model/params.h"
#include "model/train/objective.h"
#include "parallel/self_communicator.h"
#include "runtime/checkpoint.h"
#include "runtime/hdf5_file.h"
#include "runtime/token_file.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

namespace fs = std::filesystem;

class Gradients : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = preset_config("hydrahead-tiny");
    params_ = random_parameters(config_, 4);
    write_model_checkpoint(dir_.file("m.h5"), config_, params_);
    for (int32_t i = 0; i < 120; ++i) ids_.push_back((i * 37 + 11) % static_cast<int32_t>(config_.vocab_size));
    write_token_file(dir_.file("t.h5"), ids_);
  }
  ModelConfig config_;
  NamedTensors params_;
  std::vector<int32_t> ids_;
  TempDir dir_;
};

TEST_F(Gradients, FileHoldsTheLibrarysLossAndGradientsOnOneAndTwoRanks) {
  SelfCommunicator self;
  const train::NamedGradients expected = train::next_token_gradients(self, Model(config_, params_), ids_);
  const std::string base = "gradients --model " + dir_.file("m.h5") + " --input " + dir_.file("t.h5") + " --out ";
  ASSERT_EQ(hydra(base + dir_.file("g1.h5")).exit_code, 0);
  const CommandResult two = run_command(mpirun(2) + " " + hydra_binary() + " " + base + dir_.file("g2.h5"));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  for (const std::string file : {"g1.h5", "g2.h5"}) {
    const H5File f = H5File::open_read(dir_.file(file));
    EXPECT_NEAR(f.double_attribute("loss"), expected.sums.loss / 119.0, 1e-6) << file;
    EXPECT_EQ(f.dataset_names().size(), expected.grads.size()) << file;
    for (const auto& [name, g] : expected.grads) {
      ASSERT_TRUE(f.has_dataset(name)) << file << ": " << name;
      EXPECT_LT(norm_rel_error(f.read(name), g), 1e-5) << file << ": " << name;
    }
  }
}

TEST_F(Gradients, BadInputIsAOneLineErrorAndWritesNothing) {
  const std::string model = " --model " + dir_.file("m.h5"), out = dir_.file("g.h5");
  const std::string tokens = " --input " + dir_.file("t.h5");
  H5File::create(dir_.file("empty.h5")).close();  // no input_ids
  expect_user_error(hydra("gradients" + model + " --input " + dir_.file("empty.h5") + " --out " + out), "input_ids");
  write_token_file(dir_.file("one.h5"), {5});
  expect_user_error(hydra("gradients" + model + " --input " + dir_.file("one.h5") + " --out " + out), "at least 2");
  write_token_file(dir_.file("big.h5"), {1, 2, 9999});
  expect_user_error(hydra("gradients" + model + " --input " + dir_.file("big.h5") + " --out " + out), "9999");
  expect_user_error(hydra("gradients" + model + tokens + " --loss kl --out " + out), "--loss kl is not known");
  expect_user_error(hydra("gradients" + tokens + " --out " + out), "exactly one of --model");
  // An untied model whose checkpoint lost its loss head (lm_head.weight).
  NamedTensors headless = params_;
  ASSERT_EQ(headless.erase("lm_head.weight"), 1u);
  write_checkpoint(dir_.file("headless.h5"), config_to_json(config_).dump(), headless);
  expect_user_error(hydra("gradients --model " + dir_.file("headless.h5") + tokens + " --out " + out), "lm_head.weight");
  // A model whose tensor has the wrong shape.
  NamedTensors bent = params_;
  bent["model.norm.weight"] = Tensor::zeros({7}, DType::f32);
  write_checkpoint(dir_.file("bent.h5"), config_to_json(config_).dump(), bent);
  expect_user_error(hydra("gradients --model " + dir_.file("bent.h5") + tokens + " --out " + out), "model.norm.weight");
  // On 2 ranks a length the zigzag layout does not admit (121 tokens, 2P = 4).
  write_token_file(dir_.file("odd.h5"), std::vector<int32_t>(121, 3));
  const CommandResult r = run_command(mpirun(2) + " " + hydra_binary() + " gradients" + model + " --input " +
                                      dir_.file("odd.h5") + " --out " + out);
  expect_user_error(r, "not divisible by 2P = 4");
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace hydra::test
