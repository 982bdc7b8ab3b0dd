// hydra eval-lm as a user runs it: its loss over one window equals the mean next-token NLL that
// `hydra forward` reports for the same tokens (another code path: full logits, row by row), the
// mean over several windows is their token-weighted mean, 2 ranks agree with 1, and bad input is
// refused before anything is read.
#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/token_file.h"
#include "tests/common/test_util.h"
#include "tests/launch/train_log.h"

namespace hydra::test {
namespace {

// The last output line that is a JSON object (log lines of other ranks may come after it).
nlohmann::json summary_of(const CommandResult& r) {
  std::string last;
  std::stringstream in(r.output);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.front() == '{') last = line;
  }
  return nlohmann::json::parse(last);
}

TEST(EvalLmCli, MatchesForwardAndRanks) {
  const TempDir dir;
  const std::string h = hydra_binary();
  ASSERT_EQ(run_command(h + " init --preset hydrahead-tiny --weight-seed 3 --out " + dir.file("m.h5")).exit_code, 0);
  const int64_t len = 48;
  const std::vector<int32_t> all = random_tokens(3 * len + 1, 256, 1);
  write_token_file(dir.file("all.h5"), all);
  // One window = tokens [k·len, k·len + len]: forward's mean NLL over those len + 1 tokens.
  std::vector<double> per_window;
  for (int64_t k = 0; k < 3; ++k) {
    write_token_file(dir.file("w.h5"), std::vector<int32_t>(all.begin() + k * len, all.begin() + (k + 1) * len + 1));
    const CommandResult f = run_command(h + " forward --model " + dir.file("m.h5") + " --input " + dir.file("w.h5"));
    ASSERT_EQ(f.exit_code, 0) << f.output;
    per_window.push_back(summary_of(f).at("mean_nll").get<double>());
  }
  const CommandResult one = run_command(h + " eval-lm --model " + dir.file("m.h5") + " --data " + dir.file("all.h5") +
                                        " --seq-len 48 --windows 1 --device cpu --out " + dir.file("one.json"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const nlohmann::json j1 = summary_of(one);
  EXPECT_EQ(j1.at("tokens").get<int64_t>(), len);
  // forward sums in float32: agreement to ~1e-6 relative.
  EXPECT_NEAR(j1.at("loss").get<double>(), per_window[0], 1e-5 * per_window[0]);
  const CommandResult every = run_command(h + " eval-lm --model " + dir.file("m.h5") + " --data " + dir.file("all.h5") +
                                          " --seq-len 48 --windows 0 --device cpu");
  ASSERT_EQ(every.exit_code, 0) << every.output;
  const nlohmann::json j3 = summary_of(every);
  EXPECT_EQ(j3.at("windows").get<int64_t>(), 3);
  EXPECT_NEAR(j3.at("loss").get<double>(), (per_window[0] + per_window[1] + per_window[2]) / 3, 1e-5 * per_window[0]);
  const CommandResult two = run_command(mpirun(2) + " " + h + " eval-lm --model " + dir.file("m.h5") + " --data " +
                                        dir.file("all.h5") + " --seq-len 48 --windows 0 --device cpu");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const nlohmann::json j2 = summary_of(two);
  EXPECT_EQ(j2.at("ranks").get<int64_t>(), 2);
  EXPECT_NEAR(j2.at("loss").get<double>(), j3.at("loss").get<double>(), 1e-5 * j3.at("loss").get<double>());
  // Sequence groups on 4 ranks: --sp 2 (window i on group i mod 2) and --sp 1 give --sp 4's loss.
  for (const int sp : {4, 2, 1}) {
    const CommandResult g = run_command(mpirun(4) + " " + h + " eval-lm --model " + dir.file("m.h5") + " --data " +
                                        dir.file("all.h5") + " --seq-len 48 --windows 0 --device cpu --sp " + std::to_string(sp));
    ASSERT_EQ(g.exit_code, 0) << g.output;
    const nlohmann::json jg = summary_of(g);
    EXPECT_EQ(jg.at("sp").get<int>(), sp);
    EXPECT_EQ(jg.at("tokens").get<int64_t>(), 3 * len);
    // fp32 forwards over other layouts; the sums differ only in rounding.
    EXPECT_NEAR(jg.at("loss").get<double>(), j3.at("loss").get<double>(), 1e-5 * j3.at("loss").get<double>()) << sp;
  }
  // The --out file holds the summary.
  EXPECT_EQ(summary_of(CommandResult{0, run_command("cat " + dir.file("one.json")).output, 0}).at("loss"), j1.at("loss"));
}

TEST(EvalLmCli, RefusesBadInput) {
  const TempDir dir;
  const std::string h = hydra_binary();
  ASSERT_EQ(run_command(h + " init --preset qwen3-tiny --out " + dir.file("m.h5")).exit_code, 0);
  write_token_file(dir.file("short.h5"), random_tokens(20, 256, 2));
  const CommandResult missing = run_command(h + " eval-lm --model " + dir.file("m.h5") + " --data " + dir.file("nope.h5") + " --seq-len 16");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("does not exist"), std::string::npos) << missing.output;
  const CommandResult too_short = run_command(h + " eval-lm --model " + dir.file("m.h5") + " --data " + dir.file("short.h5") + " --seq-len 64");
  EXPECT_EQ(too_short.exit_code, 2) << too_short.output;
  EXPECT_NE(too_short.output.find("shorter than one window"), std::string::npos) << too_short.output;
}

}  // namespace
}  // namespace hydra::test
