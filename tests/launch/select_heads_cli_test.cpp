// hydra select-heads as a user runs it, at small sizes:
//  - one rank and `mpirun -np 2` give the same scores (1e-4) and head sets; the JSON, the HDF5 copy
//    and the summary agree; `hydra convert --fa-heads file:heads.json` builds a student with those sets;
//  - --per-layer puts exactly K heads in every layer;
//  - on the needle-head model (tests/common/needle_head_model.h) with its samples as an eval set
//    (--calib), two ranks pick the planted head;
//  - bad input is refused before any work, leaving no output file.
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "model/fa_heads_file.h"
#include "model/eval/niah_set.h"
#include "runtime/hdf5_file.h"
#include "tests/common/needle_head_model.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct SelectRun {
  CommandResult result;
  json heads;    // the --out file
  json summary;  // the last stdout line
};

class SelectHeads : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    teacher_ = dir_->file("teacher.h5");
    const ModelConfig c = preset_config("qwen3-tiny");
    write_model_checkpoint(teacher_, c, random_parameters(c, 2));
    const NeedleHeadModel m = make_needle_head_model();
    needle_model_ = dir_->file("needle.h5");
    write_model_checkpoint(needle_model_, m.config, m.params);
    niah::EvalSet set{.task = "single", .source = "needle-head test", .samples = {}};
    for (int i = 0; i < 4; ++i) {
      niah::Sample s = needle_head_sample(48, 10 * i, NeedleHeadModel::kValueBegin + 2 * i, 40 + i);
      s.depth = 25 * i;
      set.samples.push_back(s);
    }
    needle_set_ = dir_->file("needle_set.h5");
    niah::write_eval_set(needle_set_, set);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static SelectRun select(int ranks, const std::string& name, const std::string& args) {
    SelectRun run;
    const std::string out = dir_->file(name + ".json");
    run.result = run_command((ranks > 0 ? mpirun(ranks) : std::string()) + hydra_binary() + " select-heads --out " + out + " " + args);
    if (run.result.exit_code != 0) return run;
    std::ifstream in(out);
    run.heads = json::parse(in);
    const std::string& text = run.result.output;
    const size_t last = text.rfind("{\"command\"");
    if (last != std::string::npos) run.summary = json::parse(text.substr(last, text.find('\n', last) - last));
    return run;
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::string teacher_, needle_model_, needle_set_;
};

constexpr const char* kSmall = " --calib-length 128 --calib-samples 3 --lm-length 64 ";

TEST_F(SelectHeads, OneAndTwoRanksAgreeAndConvertReadsTheFile) {
  // With group patching: its jobs are spread over the ranks too, and the two runs must agree on them.
  const SelectRun a = select(0, "np1", "--model " + teacher_ + " --budget 3 --group-patching" + kSmall);
  const SelectRun b = select(2, "np2", "--model " + teacher_ + " --budget 3 --group-patching" + kSmall);
  ASSERT_EQ(a.result.exit_code, 0) << a.result.output;
  ASSERT_EQ(b.result.exit_code, 0) << b.result.output;
  EXPECT_NE(a.result.output.find("layer 2/2 scored"), std::string::npos) << "progress line";
  EXPECT_NE(a.result.output.find("effective heads"), std::string::npos) << "the concentration in the report";
  const auto la = a.heads["selection"]["groups"]["layer_total"].get<std::vector<double>>();
  const auto lb = b.heads["selection"]["groups"]["layer_total"].get<std::vector<double>>();
  ASSERT_EQ(la.size(), 2u);
  for (size_t l = 0; l < la.size(); ++l) EXPECT_NEAR(la[l], lb[l], 1e-4) << "layer_total " << l;
  EXPECT_EQ(b.heads["selection"]["concentration"]["layer_share"].size(), 2u);
  for (const char* score : {"composite", "total", "direct", "lm", "all_but_one"}) {
    const auto x = a.heads["scores"][score].get<std::vector<std::vector<double>>>();
    const auto y = b.heads["scores"][score].get<std::vector<std::vector<double>>>();
    ASSERT_EQ(x.size(), 2u);
    for (size_t l = 0; l < x.size(); ++l)
      for (size_t h = 0; h < x[l].size(); ++h) EXPECT_NEAR(x[l][h], y[l][h], 1e-4) << score << " " << l << "," << h;
  }
  EXPECT_EQ(a.heads["fa_heads"], b.heads["fa_heads"]);
  int64_t kept = 0;
  for (const auto& layer : b.heads["fa_heads"]) kept += static_cast<int64_t>(layer.size());
  EXPECT_EQ(kept, 3);
  EXPECT_EQ(b.summary["fa_heads"], 3);
  EXPECT_EQ(b.summary["ranks"], 2);
  EXPECT_EQ(b.heads["selection"]["budget"], 3);
  EXPECT_EQ(b.heads["selection"]["calibration"]["prompts"], 3);

  // The HDF5 copy holds the same scores and mask.
  const H5File h5 = H5File::open_read(dir_->file("np2.h5"));
  const Tensor total = h5.read("total"), mask = h5.read("fa_mask");
  const auto fa = b.heads["fa_heads"].get<std::vector<std::vector<int>>>();
  for (int64_t l = 0; l < 2; ++l) {
    for (int64_t h = 0; h < 4; ++h) {
      EXPECT_NEAR(total.data_as<float>()[l * 4 + h], b.heads["scores"]["total"][l][h].get<double>(), 1e-6);
      EXPECT_EQ(mask.data_as<int32_t>()[l * 4 + h], std::count(fa[l].begin(), fa[l].end(), h));
    }
  }

  const std::string student = dir_->file("student.h5");
  const CommandResult convert = run_command(hydra_binary() + " convert --teacher " + teacher_ + " --fa-heads file:" +
                                            dir_->file("np2.json") + " --out " + student);
  ASSERT_EQ(convert.exit_code, 0) << convert.output;
  EXPECT_EQ(read_model_checkpoint(student).config.fa_heads, fa);
}

TEST_F(SelectHeads, PerLayerBudgetPutsKHeadsInEveryLayer) {
  const SelectRun r = select(0, "per_layer", "--model " + teacher_ + " --budget 2 --per-layer --weights 1,0,0" + kSmall);
  ASSERT_EQ(r.result.exit_code, 0) << r.result.output;
  for (const auto& layer : r.heads["fa_heads"]) EXPECT_EQ(layer.size(), 2u);
  EXPECT_EQ(r.summary["mode"], "per_layer");
  // With weights 1,0,0 the composite ranks by total alone: each layer keeps its two highest totals.
  const auto total = r.heads["scores"]["total"].get<std::vector<std::vector<double>>>();
  const auto fa = r.heads["fa_heads"].get<std::vector<std::vector<int>>>();
  for (size_t l = 0; l < total.size(); ++l) {
    for (int h = 0; h < 4; ++h) {
      if (std::count(fa[l].begin(), fa[l].end(), h)) continue;
      for (int kept : fa[l]) EXPECT_GE(total[l][kept], total[l][h]);
    }
  }
}

TEST_F(SelectHeads, PlantedHeadFromAnEvalSetOnTwoRanks) {
  const SelectRun r = select(2, "needle-heads", "--model " + needle_model_ + " --calib " + needle_set_ + " --budget 1 --lm-length 32");
  ASSERT_EQ(r.result.exit_code, 0) << r.result.output;
  EXPECT_EQ(r.heads["fa_heads"], json::parse("[[], [2]]"));
  EXPECT_NEAR(r.heads["scores"]["total"][1][2].get<double>(), 1.0, 0.05);
  EXPECT_EQ(r.heads["selection"]["total_normalized"], true);
  EXPECT_EQ(r.heads["scores"]["total"][0][1], 0.0) << "the zero-W_o head";
}

// Sequence groups (--sp): 4 ranks as 2 groups of 2 and 1 group of 4 run each prompt and text
// sequence split over their ranks (the caches, patches, readouts and NLL sums each rank's rows) and
// give one process's scores: the planted head, the zero head, every other head.
TEST_F(SelectHeads, SequenceGroupsGiveOneProcesssScores) {
  const std::string args = "--model " + needle_model_ + " --calib " + needle_set_ + " --budget 1 --lm-length 32";
  const SelectRun one = select(0, "sp-one", args);
  ASSERT_EQ(one.result.exit_code, 0) << one.result.output;
  for (const int sp : {2, 4}) {
    const SelectRun r = select(4, "sp" + std::to_string(sp), args + " --sp " + std::to_string(sp));
    ASSERT_EQ(r.result.exit_code, 0) << r.result.output;
    EXPECT_EQ(r.summary["sp"], sp);
    EXPECT_EQ(r.heads["fa_heads"], one.heads["fa_heads"]);
    for (const char* score : {"composite", "total", "direct", "lm"}) {
      const auto x = one.heads["scores"][score].get<std::vector<std::vector<double>>>();
      const auto y = r.heads["scores"][score].get<std::vector<std::vector<double>>>();
      ASSERT_EQ(x.size(), y.size());
      for (size_t l = 0; l < x.size(); ++l) {
        for (size_t h = 0; h < x[l].size(); ++h) {
          // fp32 forwards over other layouts: the sums differ in rounding only.
          EXPECT_NEAR(x[l][h], y[l][h], 1e-4 * std::max(1.0, std::abs(x[l][h]))) << score << " " << l << "," << h << " sp " << sp;
        }
      }
    }
    EXPECT_EQ(r.heads["scores"]["total"][0][1], 0.0) << "the zero-W_o head";
  }
  const SelectRun bad = select(4, "sp-bad", "--model " + teacher_ + " --budget 3 --calib-length 130 --calib-samples 2 --lm-length 64 --sp 2");
  EXPECT_EQ(bad.result.exit_code, 2) << bad.result.output;
  EXPECT_NE(bad.result.output.find("calibration prompt 0: sequence length 130 is not divisible by 2P = 4"), std::string::npos)
      << bad.result.output;
}

TEST_F(SelectHeads, BadInputIsRefusedBeforeAnyWork) {
  const auto refused = [&](const std::string& args, const std::string& message) {
    const std::string out = dir_->file("bad.json");
    const CommandResult r = run_command(hydra_binary() + " select-heads --out " + out + " " + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
    EXPECT_FALSE(fs::exists(out)) << args;
  };
  refused("--model " + teacher_ + " --budget 9", "--budget 9: the model has 8 heads");
  refused("--model " + teacher_ + " --budget 5 --per-layer", "a layer has 4 heads");
  refused("--model " + teacher_ + " --budget 0", "--budget must be at least 1");
  refused("--model " + teacher_ + " --budget 1 --weights 1,x,0", "'x' is not a non-negative number");
  refused("--model " + teacher_ + " --budget 1 --weights 0,0,0", "at least one weight must be positive");
  refused("--model " + teacher_ + " --budget 1 --lm-samples 0", "--lm-samples 0 measures no lm score");
  refused("--model " + teacher_ + " --budget 1 --calib " + needle_set_ + " --calib-length 64", "cannot be combined with --calib");
  refused("--model " + teacher_ + " --budget 1 --calib-length 10", "too short for NIAH task single");
  refused("--preset hydrahead-tiny --budget 1", "select-heads scores the heads of a Qwen3 teacher");
}

}  // namespace
}  // namespace hydra::test
