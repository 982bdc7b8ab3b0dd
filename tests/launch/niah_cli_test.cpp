// hydra eval-niah as a user runs it, at small lengths: one rank and `mpirun -np 2` give the same
// per-sample verdicts and log-probabilities, and so do sequence groups (--sp 1, 2, 4 on 4 ranks); the JSON lines, the HDF5 copy, the table and the
// summary agree with each other; an HDF5 eval set of the generator's samples (--dataset) gives
// the generator's results, recall included when the set names its item separator; bad input is refused before any work, leaving no output file.
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "model/eval/niah.h"
#include "model/eval/niah_set.h"
#include "model/params.h"
#include "runtime/hdf5_file.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct EvalRun {
  CommandResult result;
  std::vector<json> lines;  // the --out JSON lines
  json summary;             // the last stdout line
};

class EvalNiah : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    model_ = dir_->file("tiny.h5");
    const ModelConfig c = preset_config("hydrahead-tiny");
    write_model_checkpoint(model_, c, random_parameters(c, 1));
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  // Runs eval-niah on `ranks` ranks (0: no mpirun) writing `name`.jsonl / .h5.
  static EvalRun eval(int ranks, const std::string& name, const std::string& args) {
    EvalRun run;
    const std::string out = dir_->file(name + ".jsonl");
    run.result = run_command((ranks > 0 ? mpirun(ranks) : std::string()) + hydra_binary() + " eval-niah --model " + model_ +
                             " --out " + out + " " + args);
    if (run.result.exit_code != 0) return run;
    std::ifstream in(out);
    for (std::string line; std::getline(in, line);) run.lines.push_back(json::parse(line));
    const std::string& text = run.result.output;
    const size_t last = text.rfind("{\"command\"");
    if (last != std::string::npos) run.summary = json::parse(text.substr(last, text.find('\n', last) - last));
    return run;
  }

  static std::vector<json> of_type(const EvalRun& run, const std::string& type) {
    std::vector<json> out;
    for (const json& j : run.lines) {
      if (j["type"] == type) out.push_back(j);
    }
    return out;
  }

  static void expect_same_samples(const EvalRun& a, const EvalRun& b) {
    const std::vector<json> x = of_type(a, "sample"), y = of_type(b, "sample");
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(x[i]["correct"], y[i]["correct"]) << i;
      EXPECT_EQ(x[i]["predicted"], y[i]["predicted"]) << i;
      EXPECT_EQ(x[i]["answer"], y[i]["answer"]) << i;
      EXPECT_EQ(x[i]["length"], y[i]["length"]) << i;
      EXPECT_EQ(x[i]["depth"], y[i]["depth"]) << i;
      // fp32 forward; only the summation order differs between the layouts.
      EXPECT_NEAR(x[i]["logprob"].get<double>(), y[i]["logprob"].get<double>(), 1e-4) << i;
    }
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::string model_;
};

constexpr const char* kGrid = "--lengths 256,512 --depths 0,50,100 --samples 2 --seed 3";

TEST_F(EvalNiah, OneAndTwoRanksAgreeAndTheOutputsAreConsistent) {
  const std::string args = std::string(kGrid) + " --task single,multivalue";
  const EvalRun one = eval(0, "p1", args), two = eval(2, "p2", args);
  ASSERT_EQ(one.result.exit_code, 0) << one.result.output;
  ASSERT_EQ(two.result.exit_code, 0) << two.result.output;
  const int64_t cells = 2 * 2 * 3, samples = cells * 2;
  for (const EvalRun* run : {&one, &two}) {
    EXPECT_EQ(static_cast<int64_t>(run->lines.size()), cells + samples);
    EXPECT_NE(run->result.output.find("NIAH multivalue: accuracy (teacher-forced: the greedy verdict) by depth (rows) and length (columns)"), std::string::npos);
    EXPECT_NE(run->result.output.find("[cell 12/12]"), std::string::npos) << "progress per cell";
    ASSERT_TRUE(run->summary.is_object()) << run->result.output;
    EXPECT_EQ(run->summary["samples"], samples);
    EXPECT_EQ(run->summary["cells"], cells);
    // Cell lines follow their samples and agree with them.
    int64_t pending = 0, correct = 0;
    for (const json& j : run->lines) {
      if (j["type"] == "sample") {
        ++pending;
        correct += j["correct"].get<bool>() ? 1 : 0;
        EXPECT_EQ(j["answer"].size(), j["answer_length"].get<size_t>());
        EXPECT_EQ(j["answer_start"].get<int64_t>() + j["answer_length"].get<int64_t>(), j["length"].get<int64_t>());
        EXPECT_LE(j["logprob"].get<double>(), 0.0);
        continue;
      }
      EXPECT_EQ(j["samples"], pending);
      EXPECT_EQ(j["correct"], correct);
      EXPECT_GE(j["accuracy"].get<double>(), 0.0);
      EXPECT_LE(j["accuracy"].get<double>(), 1.0);
      pending = correct = 0;
    }
  }
  expect_same_samples(one, two);
  EXPECT_EQ(two.summary["ranks"], 2);
  // The HDF5 copy holds the same numbers.
  const H5File h5 = H5File::open_read(dir_->file("p2.h5"));
  EXPECT_EQ(h5.string_attribute("format"), "hydrahead-niah-results");
  EXPECT_EQ(h5.int_attribute("cells_done"), cells);
  const Tensor correct = h5.read("sample_correct"), logprob = h5.read("sample_logprob"), acc = h5.read("cell_accuracy");
  ASSERT_EQ(correct.numel(), samples);
  ASSERT_EQ(acc.numel(), cells);
  const std::vector<json> rows = of_type(two, "sample"), cell_rows = of_type(two, "cell");
  for (int64_t i = 0; i < samples; ++i) {
    EXPECT_EQ(correct.data_as<int32_t>()[i], rows[i]["correct"].get<bool>() ? 1 : 0);
    EXPECT_NEAR(logprob.data_as<float>()[i], rows[i]["logprob"].get<double>(), 1e-4);
  }
  for (int64_t i = 0; i < cells; ++i) EXPECT_NEAR(acc.data_as<float>()[i], cell_rows[i]["accuracy"].get<double>(), 1e-6);
  EXPECT_EQ(h5.read("answer_tokens").numel(), h5.read("predicted_tokens").numel());
}

TEST_F(EvalNiah, DatasetOfTheGeneratorsSamplesGivesItsResults) {
  niah::EvalSet set{.task = "single", .source = "test", .samples = {}};
  niah::TaskParams p;
  for (int64_t length : {256, 512}) {
    for (int64_t depth : {0, 50, 100}) {
      for (int64_t i = 0; i < 2; ++i) set.samples.push_back(niah::generate_sample(p, 256, 3, length, depth, i));
    }
  }
  niah::write_eval_set(dir_->file("set.h5"), set);
  const EvalRun builtin = eval(0, "builtin", kGrid), from_set = eval(2, "from_set", "--dataset " + dir_->file("set.h5"));
  ASSERT_EQ(builtin.result.exit_code, 0) << builtin.result.output;
  ASSERT_EQ(from_set.result.exit_code, 0) << from_set.result.output;
  EXPECT_EQ(from_set.lines.size(), builtin.lines.size());
  expect_same_samples(builtin, from_set);
  EXPECT_EQ(from_set.summary["source"], dir_->file("set.h5"));
}

// A set of a RULER family's samples with the SEP marker as its item_separator scores recall item by
// item as the generator's run does (order-free); without the attribute the answer is one item.
TEST_F(EvalNiah, DatasetWithItemSeparatorGivesTheFamilysRecall) {
  for (const char* task : {"multiquery", "vartrack"}) {
    niah::EvalSet set{.task = task, .source = "test", .item_separator = niah::markers_for(256).sep, .samples = {}};
    niah::TaskParams p;
    p.task = niah::parse_task(task);
    p.hops = 2;
    for (int64_t depth : {0, 100}) {
      for (int64_t i = 0; i < 2; ++i) set.samples.push_back(niah::generate_sample(p, 256, 3, 256, depth, i));
    }
    niah::write_eval_set(dir_->file("ruler_items.h5"), set);
    EXPECT_EQ(niah::read_eval_set(dir_->file("ruler_items.h5"), 256).item_separator, set.item_separator);
    const EvalRun builtin = eval(0, "ruler_builtin", std::string("--lengths 256 --depths 0,100 --samples 2 --seed 3 --hops 2 --task ") + task),
                  from_set = eval(0, "ruler_set", "--dataset " + dir_->file("ruler_items.h5"));
    ASSERT_EQ(builtin.result.exit_code, 0) << builtin.result.output;
    ASSERT_EQ(from_set.result.exit_code, 0) << from_set.result.output;
    expect_same_samples(builtin, from_set);
    const std::vector<json> x = of_type(builtin, "sample"), y = of_type(from_set, "sample");
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i]["recall"], y[i]["recall"]) << task << " sample " << i;
    // Read as one item, a recall can only be 0 or 1.
    set.item_separator = -1;
    niah::write_eval_set(dir_->file("ruler_items_one.h5"), set);
    const EvalRun whole = eval(0, "ruler_one_item", "--dataset " + dir_->file("ruler_items_one.h5"));
    ASSERT_EQ(whole.result.exit_code, 0) << whole.result.output;
    for (const json& j : of_type(whole, "sample")) {
      EXPECT_TRUE(j["recall"].get<double>() == 0.0 || j["recall"].get<double>() == 1.0) << task;
    }
  }
}

// --sp 2 on 4 ranks: two groups take alternate samples (3 per cell, so rounds straddle cells) and
// rank 0 writes them in plan order: the same samples, verdicts and cells as --sp 4 and as --sp 1.
TEST_F(EvalNiah, SequenceGroupsGiveTheWholeWorldsResults) {
  const std::string args = "--lengths 256,512 --depths 0,50,100 --samples 3 --seed 5 --task single,multivalue";
  const EvalRun whole = eval(4, "sp4", args + " --sp 4"), halves = eval(4, "sp2", args + " --sp 2"),
                ones = eval(4, "sp1", args + " --sp 1");
  for (const EvalRun* run : {&whole, &halves, &ones}) {
    ASSERT_EQ(run->result.exit_code, 0) << run->result.output;
    EXPECT_EQ(run->lines.size(), 12u + 36u);
    EXPECT_EQ(run->summary["ranks"], 4);
    EXPECT_EQ(run->summary["samples"], 36);
  }
  EXPECT_EQ(whole.summary["sp"], 4);
  EXPECT_EQ(halves.summary["sp"], 2);
  expect_same_samples(whole, halves);
  expect_same_samples(whole, ones);
  // The same order of lines: each cell line after its own samples, with their counts.
  for (size_t i = 0; i < whole.lines.size(); ++i) {
    EXPECT_EQ(whole.lines[i]["type"], halves.lines[i]["type"]) << i;
    EXPECT_EQ(whole.lines[i]["task"], halves.lines[i]["task"]) << i;
    EXPECT_EQ(whole.lines[i].value("sample", -1), halves.lines[i].value("sample", -1)) << i;
    EXPECT_EQ(whole.lines[i]["correct"], halves.lines[i]["correct"]) << i;
  }
  EXPECT_EQ(whole.summary["accuracy"], halves.summary["accuracy"]);
}

// --score generate (greedy decoding of each answer with the cache) on 2 groups of 2 ranks: the
// teacher-forced verdict on every sample, the same first token, and the recall fields.
TEST_F(EvalNiah, GenerationScoringGivesTheTeacherForcedVerdicts) {
  const std::string args = std::string(kGrid) + " --task single,multivalue --sp 2";
  const EvalRun tf = eval(4, "tf", args), gen = eval(4, "gen", args + " --score generate");
  ASSERT_EQ(tf.result.exit_code, 0) << tf.result.output;
  ASSERT_EQ(gen.result.exit_code, 0) << gen.result.output;
  EXPECT_EQ(tf.summary["score"], "teacher-forced");
  EXPECT_EQ(gen.summary["score"], "generate");
  const std::vector<json> x = of_type(tf, "sample"), y = of_type(gen, "sample");
  ASSERT_EQ(x.size(), 24u);
  ASSERT_EQ(y.size(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i]["correct"], y[i]["correct"]) << i;
    EXPECT_EQ(x[i]["predicted"][0], y[i]["predicted"][0]) << i << ": both the arg-max after the prompt";
    EXPECT_EQ(y[i]["predicted"].size(), y[i]["answer"].size()) << i;
    const double recall = y[i]["recall"].get<double>();
    EXPECT_GE(recall, 0.0);
    EXPECT_LE(recall, 1.0);
    if (y[i]["correct"].get<bool>()) {
      EXPECT_EQ(recall, 1.0) << i;
    }
  }
  // The JSON lines say how they were scored (files of both scorings are merged by scripts).
  for (const json& j : of_type(tf, "cell")) EXPECT_EQ(j["score"], "teacher-forced");
  for (const json& j : of_type(gen, "cell")) EXPECT_EQ(j["score"], "generate");
  EXPECT_EQ(H5File::open_read(dir_->file("gen.h5")).string_attribute("scoring"), "generate");
  EXPECT_EQ(H5File::open_read(dir_->file("gen.h5")).read("sample_recall").numel(), 24);
}

// RULER's families in one job beside NIAH's: cwe and fwe get one cell per length, every sample a
// recall, and rank 0 prints RULER's table (tasks by lengths, average row); 2 groups of 1 rank
// give one process's samples.
TEST_F(EvalNiah, RulerFamiliesRunBesideNiahAndPrintTheirTable) {
  const std::string args = "--lengths 256,512 --depths 0,100 --samples 2 --seed 4 --task single,multiquery,vartrack,cwe,fwe "
                           "--common-words 4 --common-freq 6 --uncommon-freq 2 --hops 2";
  const EvalRun one = eval(0, "ruler1", args + " --score teacher-forced"),
                two = eval(2, "ruler2", args + " --sp 1 --score teacher-forced"),
                gen = eval(2, "ruler3", args + " --sp 1");  // RULER's families: generated by default
  ASSERT_EQ(one.result.exit_code, 0) << one.result.output;
  ASSERT_EQ(two.result.exit_code, 0) << two.result.output;
  ASSERT_EQ(gen.result.exit_code, 0) << gen.result.output;
  const int64_t cells = 3 * 2 * 2 + 2 * 2;  // three tasks with depths, two without
  EXPECT_EQ(one.summary["cells"], cells);
  EXPECT_EQ(one.summary["samples"], 2 * cells);
  expect_same_samples(one, two);
  const std::vector<json> x = of_type(one, "sample"), y = of_type(gen, "sample");
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i]["correct"], y[i]["correct"]) << i;
    EXPECT_EQ(x[i]["predicted"][0], y[i]["predicted"][0]) << i;
    EXPECT_GE(y[i]["recall"].get<double>(), 0.0);
    EXPECT_LE(y[i]["recall"].get<double>(), 1.0);
  }
  for (const json& j : of_type(one, "cell")) {
    if (j["task"] == "cwe" || j["task"] == "fwe") {
      EXPECT_EQ(j["depth"], 0);
    }
  }
  // The scoring mode in every table title and every JSON line: teacher-forced recall is not RULER's score.
  EXPECT_EQ(gen.summary["score"], "generate");
  for (const EvalRun* run : {&one, &gen}) {
    for (const json& j : run->lines) EXPECT_EQ(j["score"], run == &one ? "teacher-forced" : "generate") << j.dump();
  }
  const std::string& out = one.result.output;
  EXPECT_NE(out.find("Recall of the teacher-forced arg-maxes (teacher-forced: not RULER's score, which reads generated "
                     "text: --score generate), %: tasks (rows) by length (columns)"), std::string::npos) << out;
  EXPECT_NE(out.find("NIAH single: accuracy (teacher-forced: the greedy verdict)"), std::string::npos) << out;
  EXPECT_NE(gen.result.output.find("RULER score (generate: mean recall of the generated answers, RULER's "
                                   "string_match_all, %)"), std::string::npos) << gen.result.output;
  for (const char* row : {"multiquery", "vartrack", "cwe", "fwe", "avg"}) EXPECT_NE(out.find(std::string("\n") + row), std::string::npos) << row;
}

// --suite ruler: every family at every length, the knobs sized to each length as RULER sizes them
// (cwe below 4K: common words 6 times, the others once; fwe: length/50 distinct words), each change
// logged and kept in its cells' lines; scored by generation; one table (RULER's), not seven.
TEST_F(EvalNiah, RulerSuiteRunsEveryFamilySizedToTheLength) {
  const EvalRun r = eval(2, "suite", "--suite ruler --lengths 256,512 --depths 0,100 --samples 1 --seed 2 --sp 1");
  ASSERT_EQ(r.result.exit_code, 0) << r.result.output;
  const std::string& out = r.result.output;
  EXPECT_EQ(r.summary["tasks"], json({"single", "multikey", "multivalue", "multiquery", "vartrack", "cwe", "fwe"}));
  EXPECT_EQ(r.summary["cells"], 5 * 2 * 2 + 2 * 2);
  EXPECT_EQ(r.summary["score"], "generate");
  EXPECT_NE(out.find("cwe at 256: --common-freq 30 -> 6, --uncommon-freq 3 -> 1 (sized to the length as RULER does)"),
            std::string::npos) << out;
  EXPECT_NE(out.find("fwe at 512: --fwe-words 0 -> 10"), std::string::npos) << out;
  int sized = 0;
  for (const json& j : of_type(r, "cell")) {
    if (j["task"] == "cwe") {
      EXPECT_EQ(j["sized"], "--common-freq 30 -> 6, --uncommon-freq 3 -> 1") << j.dump();
      ++sized;
    }
    if (j["task"] == "single") EXPECT_FALSE(j.contains("sized")) << j.dump();
  }
  EXPECT_EQ(sized, 2);
  EXPECT_NE(out.find("RULER score (generate:"), std::string::npos) << out;
  EXPECT_EQ(out.find("NIAH single: accuracy"), std::string::npos) << "the suite prints one table\n" << out;
  // At 128 tokens cwe's ten words do not fit even at RULER's short-context frequencies: the count shrinks.
  const EvalRun tiny = eval(0, "suite128", "--suite ruler --lengths 128 --depths 50 --samples 1");
  ASSERT_EQ(tiny.result.exit_code, 0) << tiny.result.output;
  EXPECT_NE(tiny.result.output.find("cwe at 128: --common-freq 30 -> 6, --uncommon-freq 3 -> 1, --common-words 10 -> "),
            std::string::npos) << tiny.result.output;
  // A knob given is kept: one that cannot fit is refused naming the knob to shrink.
  const EvalRun kept = eval(0, "suite-kept", "--suite ruler --lengths 256 --common-freq 30 --common-words 10");
  EXPECT_NE(kept.result.exit_code, 0);
  EXPECT_NE(kept.result.output.find("256 is too short for NIAH task cwe: its needles, query and answer need up to 934 "
                                    "tokens; shrink --common-words 10 x --common-freq 30 words"), std::string::npos)
      << kept.result.output;
  const EvalRun bare = eval(0, "cwe-bare", "--task cwe --lengths 512");
  EXPECT_NE(bare.result.output.find("or pass --suite ruler to size the knobs to each length as RULER does"),
            std::string::npos) << bare.result.output;
  const EvalRun both = eval(0, "suite-task", "--suite ruler --task single --lengths 256");
  EXPECT_NE(both.result.output.find("--suite ruler runs RULER's seven families; it cannot be combined with --task"),
            std::string::npos) << both.result.output;
}

TEST_F(EvalNiah, BadInputIsRefusedBeforeWork) {
  const auto refused = [&](int ranks, const std::string& args, const std::string& needle) {
    const EvalRun r = eval(ranks, "bad", args);
    EXPECT_NE(r.result.exit_code, 0) << args;
    EXPECT_NE(r.result.output.find("hydra: error"), std::string::npos) << r.result.output;
    EXPECT_NE(r.result.output.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.result.output;
    EXPECT_FALSE(fs::exists(dir_->file("bad.jsonl"))) << args;
    EXPECT_FALSE(fs::exists(dir_->file("bad.h5"))) << args;
  };
  refused(0, "--lengths 256 --task haystack", "unknown NIAH task 'haystack'");
  refused(0, "--lengths 256 --depths 0,101", "--depths: 101 is outside 0..100");
  refused(0, "--lengths 16", "--lengths: 16 is too short for NIAH task single");
  refused(0, "--lengths 256 --samples 0", "--samples must be at least 1");
  refused(0, "--lengths 256 --score greedy", "--score: unknown scoring 'greedy'");
  refused(0, "--lengths 256 --score generate --cuda-graph maybe", "--cuda-graph must be on, off or auto");
  // The CPU decodes eagerly; a graph is asked for only of generation on the GPU.
  refused(0, "--lengths 256 --score generate --cuda-graph on", "--cuda-graph on needs --score generate on the GPU");
  refused(0, "--lengths 256 --cuda-graph", "--cuda-graph on needs --score generate on the GPU");
  refused(0, "--lengths 256 --task cwe", "--lengths: 256 is too short for NIAH task cwe");
  refused(0, "--lengths 4K --task fwe --zipf-alpha -1", "--zipf-alpha must be positive");
  refused(0, "--lengths 256 --value-length 3..1", "value length 3..1");
  refused(0, "--depths 50", "give --lengths");
  refused(0, "--dataset " + model_ + " --lengths 256", "--lengths configures the built-in generator");
  refused(0, "--dataset " + model_, "not a NIAH eval set");
  refused(2, "--lengths 258", "sequence length 258 is not divisible by 2P = 4");
  // A group of --sp ranks needs 2·sp segments, as the whole world does without --sp.
  refused(4, "--lengths 258 --sp 2", "sequence length 258 is not divisible by 2P = 4");
  refused(4, "--lengths 256 --sp 3", "--sp 3 must divide the number of ranks (4)");
  refused(3, "--dataset " + fixture_dir() + "/niah/greedy_set.h5",
          "greedy_set.h5: sample 0: sequence length 64 is not divisible by 2P = 6");
  const CommandResult help = run_command(hydra_binary() + " eval-niah --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("usage: hydra eval-niah"), std::string::npos);
  // Each flag once (at 6777ccb --allow-nonfinite was listed twice, here and in select-heads).
  for (const char* command : {"eval-niah", "select-heads"}) {
    const std::string text = run_command(hydra_binary() + " " + command + " --help").output;
    const size_t first = text.find("--allow-nonfinite");
    EXPECT_NE(first, std::string::npos) << command;
    EXPECT_EQ(text.find("--allow-nonfinite", first + 1), std::string::npos) << command << " lists --allow-nonfinite twice";
  }
  EXPECT_NE(run_command(hydra_binary() + " --help").output.find("eval-niah"), std::string::npos);
}

}  // namespace
}  // namespace hydra::test
