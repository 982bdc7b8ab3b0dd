// A failure on one rank ends the whole mpirun job within seconds with a non-zero exit and the
// message: an exception mid-forward, a model file that fails to open on one rank, and a
// rank that dies without a word (abort). HYDRA_INJECT_FAULT (runtime/fault.h) plants the failure.
#include "model/model.h"
#include "model/params.h"
#include "runtime/hdf5_file.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

class RankFailure : public ::testing::Test {
 protected:
  void SetUp() override {
    const ModelConfig c = preset_config("hydrahead-tiny");
    write_model_checkpoint(dir_.file("m.h5"), c, random_parameters(c, 2));
  }
  CommandResult run(int ranks, const std::string& fault) {
    return run_command("HYDRA_INJECT_FAULT=" + fault + " timeout 120 " + mpirun(ranks) + hydra_binary() +
                       " forward --model " + dir_.file("m.h5") + " --seq-len 240 --output " + dir_.file("out.h5"));
  }
  TempDir dir_;
};

TEST_F(RankFailure, ExceptionOnOneRankEndsTheJob) {
  const CommandResult r = run(3, "1:layer");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "timed out: a rank was left waiting\n" << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
  EXPECT_NE(r.output.find("hydra: internal error (rank 1): injected fault at 'layer'"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir_.file("out.h5")));
}

TEST_F(RankFailure, UnreadableModelOnOneRankEndsTheJob) {
  const CommandResult r = run(4, "3:load");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
  EXPECT_NE(r.output.find("(rank 3): injected fault at 'load'"), std::string::npos) << r.output;
}

TEST_F(RankFailure, CrashedRankEndsTheJob) {
  const CommandResult r = run(2, "1:crash");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir_.file("out.h5")));
}

TEST_F(RankFailure, InadmissibleLengthIsRefusedOnEveryRank) {
  const CommandResult r = run_command(mpirun(3) + hydra_binary() + " forward --model " + dir_.file("m.h5") + " --seq-len 100");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("sequence length 100 is not divisible by 2P = 6 (zigzag layout over P = 3 ranks); use a "
                          "multiple of 6, e.g. 96 or 102"),
            std::string::npos)
      << r.output;
}

// Bad input fails on every rank alike; the job reports it once (rank 0), not once per rank.
TEST_F(RankFailure, AnErrorEveryRankHitsIsPrintedOnce) {
  const CommandResult r = run_command(mpirun(3) + hydra_binary() + " forward --model " + dir_.file("m.h5") +
                                      " --seq-len 96 --token-seed abc");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  size_t count = 0;
  for (size_t at = r.output.find("hydra: error"); at != std::string::npos; at = r.output.find("hydra: error", at + 1)) ++count;
  EXPECT_EQ(count, 1u) << r.output;
  EXPECT_NE(r.output.find("hydra: error (rank 0)"), std::string::npos) << r.output;
}

TEST_F(RankFailure, MultiRankOutputEqualsSingleRankOutput) {
  // The end-to-end CLI path: rank 0 gathers and writes logits in global order.
  const std::string base = hydra_binary() + " forward --model " + dir_.file("m.h5") + " --seq-len 120 --output ";
  ASSERT_EQ(run_command(base + dir_.file("p1.h5")).exit_code, 0);
  const CommandResult r = run_command(mpirun(4) + base + dir_.file("p4.h5"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const H5File a = H5File::open_read(dir_.file("p1.h5")), b = H5File::open_read(dir_.file("p4.h5"));
  expect_close(b.read("logits"), a.read("logits"), 1e-5, "P=4 vs P=1 logits file");
}

}  // namespace
}  // namespace hydra::test
