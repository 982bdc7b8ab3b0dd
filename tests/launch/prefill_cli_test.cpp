// hydra prefill on the CPU path (the GPU path is the same code with other kernels, run on an H200
// by cluster/gpu_validate.sh): it runs, times every repeat, reports the FLOPs of the cost model, the
// process's peak memory and no meaningless fraction of a GPU ceiling; on 2 ranks it predicts the
// same last token; and bad input is refused before any weight is built.
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/cost.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

// The summary: the last line of the output that parses as a JSON object.
nlohmann::json summary_of(const CommandResult& r) {
  std::istringstream in(r.output);
  nlohmann::json last;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] != '{') continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object()) last = j;
  }
  return last;
}

TEST(Prefill, CpuRunReportsTimesFlopsAndMemory) {
  const CommandResult r = hydra("prefill --preset hydrahead-tiny --seq-len 1K --device cpu --repeat 2 --warmup 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json s = summary_of(r);
  ASSERT_TRUE(s.is_object()) << r.output;
  EXPECT_EQ(s.at("command"), "prefill");
  EXPECT_EQ(s.at("device"), "cpu");
  EXPECT_EQ(s.at("seq_len"), 1024);
  ASSERT_EQ(s.at("seconds_all").size(), 2u);
  EXPECT_GT(s.at("seconds").get<double>(), 0.0);
  const FlopCount f = prefill_flops(preset_config("hydrahead-tiny"), 1024);
  EXPECT_DOUBLE_EQ(s.at("flops").at("gemm").get<double>(), f.gemm);
  EXPECT_DOUBLE_EQ(s.at("flops").at("attention").get<double>(), f.attention);
  EXPECT_DOUBLE_EQ(s.at("flops").at("gdn").get<double>(), f.gdn);
  EXPECT_TRUE(s.at("fraction_of_peak").is_null()) << "a GPU ceiling means nothing on the CPU path";
  EXPECT_GT(s.at("peak_memory_gib").get<double>(), 0.0);
  EXPECT_EQ(r.output.find("% of 790"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("peak memory 0.00 GiB"), std::string::npos) << r.output;
  const int64_t last = s.at("last_token").get<int64_t>();
  EXPECT_GE(last, 0);
  EXPECT_LT(last, 256);
  // Sequence parallel over 2 ranks: the same model and tokens give the same last prediction.
  const CommandResult two = run_command(mpirun(2) + " " + hydra_binary() +
                                        " prefill --preset hydrahead-tiny --seq-len 1K --device cpu");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_EQ(summary_of(two).at("last_token").get<int64_t>(), last) << two.output;
  EXPECT_EQ(summary_of(two).at("ranks"), 2);
}

TEST(Prefill, BadInputIsRefusedBeforeWork) {
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--preset hydrahead-tiny --seq-len 0 --device cpu", "sequence length must be positive"},
           {"--preset hydrahead-tiny --seq-len 12Q --device cpu", "--seq-len"},
           {"--preset nope --seq-len 1K --device cpu", "unknown preset 'nope'"},
           {"--preset hydrahead-tiny --seq-len 1K --repeat 0 --device cpu", "--repeat must be >= 1"},
           {"--preset hydrahead-tiny --seq-len 1K --progress sometimes --device cpu", "--progress must be on, off or auto"},
           {"--preset hydrahead-tiny --seq-len 1K --device tpu", "--device must be cuda, cpu or auto"}}) {
    const CommandResult r = hydra("prefill " + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("hydra: error"), std::string::npos) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << ": expected '" << needle << "' in\n" << r.output;
  }
  const CommandResult odd = run_command(mpirun(2) + " " + hydra_binary() + " prefill --preset hydrahead-tiny --seq-len 1001 --device cpu");
  EXPECT_EQ(odd.exit_code, 2) << odd.output;
  EXPECT_NE(odd.output.find("not divisible by 2P = 4"), std::string::npos) << odd.output;
}

}  // namespace
}  // namespace hydra::test
