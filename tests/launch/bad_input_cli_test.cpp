// Bad input on the newer surfaces, each case as a user meets it through the hydra binary:
// ranks that read different prompt offsets, masks or documents under the same path (each rank
// started in its own directory, a stale copy on one node); HF folders whose weights and config
// disagree; generate's flags at their limits; the spelling of the weights' seed; the bare command.
// Every case ends with a one-line error (exit 2) before any work, leaving no output, or with the
// correct result.
//
// HYDRA_TEST_BINARY=/path/to/hydra runs these against another build (test_util.h), e.g. the commit
// before the fixes, to see each case fail there.
#include <hdf5.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model/params.h"
#include "runtime/checkpoint.h"
#include "runtime/hdf5_file.h"
#include "runtime/token_file.h"
#include "tests/common/test_util.h"
#include "tests/launch/train_log.h"

namespace hydra::test {
namespace {

namespace fs = std::filesystem;

// A user error that came as one line, quickly, and was no internal error or crash.
void expect_clean_error(const CommandResult& r, const std::string& needle) {
  expect_user_error(r, needle);
  EXPECT_NE(r.exit_code, 124) << "timed out\n" << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("double free"), std::string::npos) << r.output;
}

std::vector<int32_t> tokens(int64_t n, int32_t salt = 0) { return strided_ids(n, 256, 37, 11 + salt); }

void write_i64(H5File& file, const std::string& name, const std::vector<int64_t>& values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::i64);
  std::copy(values.begin(), values.end(), t.data_as<int64_t>());
  file.write(name, t);
}

// A prompt file: input_ids and, unless empty, a dataset `offsets_name` of offsets.
void write_prompts(const std::string& path, const std::vector<int32_t>& ids, const std::string& offsets_name,
                   const std::vector<int64_t>& offsets) {
  H5File file = H5File::create(path);
  Tensor t = Tensor::empty({static_cast<int64_t>(ids.size())}, DType::i32);
  std::copy(ids.begin(), ids.end(), t.data_as<int32_t>());
  file.write("input_ids", t);
  if (!offsets.empty()) write_i64(file, offsets_name, offsets);
  file.close();
}

// ---- Defects 1 and 2: every dataset a command reads enters the ranks' agreement ------------------

class PerRankFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int r : {0, 1}) {
      fs::create_directories(dir_.path() / fmt::format("r{}", r));
      write_model_checkpoint(dir_.file(fmt::format("r{}/m.h5", r)), preset_config("hydrahead-tiny"),
                             random_parameters(preset_config("hydrahead-tiny"), 3));
    }
  }
  std::string file(int rank, const std::string& name) const { return dir_.file(fmt::format("r{}/{}", rank, name)); }
  TempDir dir_;
};

// Before: the same ids on both ranks, offsets [0,10,64] and [0,40,64]: "double free or corruption".
TEST_F(PerRankFiles, GeneratePromptOffsetsThatDifferAreRefused) {
  write_prompts(file(0, "p.h5"), tokens(64), "prompt_offsets", {0, 10, 64});
  write_prompts(file(1, "p.h5"), tokens(64), "prompt_offsets", {0, 40, 64});
  const CommandResult r = hydra_per_rank_dirs(dir_, "generate --model m.h5 --prompt p.h5 --max-new-tokens 4 "
                                                    "--device cpu --out out.jsonl");
  expect_clean_error(r, "prompt_offsets' differs");
  EXPECT_FALSE(fs::exists(file(0, "out.jsonl")));
}

// Before: mixed figures from the two files (forward, gradients and eval-lm alike).
TEST_F(PerRankFiles, LossMaskThatDiffersIsRefusedByEveryCommand) {
  std::vector<uint8_t> mask0(128, 1), mask1(128, 1);
  for (size_t i = 0; i < 128; i += 3) mask1[i] = 0;
  write_token_data(file(0, "t.h5"), tokens(128), mask0);
  write_token_data(file(1, "t.h5"), tokens(128), mask1);
  for (const std::string cmd : {"forward --model m.h5 --input t.h5 --device cpu",
                                "gradients --model m.h5 --input t.h5 --device cpu --out g.h5",
                                "eval-lm --model m.h5 --data t.h5 --seq-len 64 --device cpu"}) {
    SCOPED_TRACE(cmd);
    expect_clean_error(hydra_per_rank_dirs(dir_, cmd), "loss_mask' differs");
  }
}

TEST_F(PerRankFiles, DocumentOffsetsThatDifferAreRefused) {
  write_token_data(file(0, "t.h5"), tokens(128), {}, {0, 50, 128});
  write_token_data(file(1, "t.h5"), tokens(128), {}, {0, 70, 128});
  for (const std::string cmd : {"forward --model m.h5 --input t.h5 --device cpu",
                                "eval-lm --model m.h5 --data t.h5 --seq-len 64 --device cpu"}) {
    SCOPED_TRACE(cmd);
    expect_clean_error(hydra_per_rank_dirs(dir_, cmd), "document_offsets' differs");
  }
}

// The model's weights too (same config, other values: a stale checkpoint on one node).
TEST_F(PerRankFiles, WeightsThatDifferAreRefused) {
  write_model_checkpoint(file(1, "m.h5"), preset_config("hydrahead-tiny"),
                         random_parameters(preset_config("hydrahead-tiny"), 4));
  expect_clean_error(hydra_per_rank_dirs(dir_, "forward --model m.h5 --seq-len 64 --device cpu"), "differs");
}

// The same contents written at different times (HDF5 stores timestamps) agree: values, not bytes.
TEST_F(PerRankFiles, SameValuesInFilesOfOtherBytesAgree) {
  write_token_data(file(0, "t.h5"), tokens(128), std::vector<uint8_t>(128, 1), {0, 50, 128});
  write_token_data(file(1, "t.h5"), tokens(128), std::vector<uint8_t>(128, 1), {0, 50, 128});
  const CommandResult r = hydra_per_rank_dirs(dir_, "forward --model m.h5 --input t.h5 --device cpu");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// ---- Defect 6: import refuses what every later command refuses or misreads -----------------------

// A safetensors file from a header and data section as given (to make damaged ones).
void write_safetensors(const fs::path& path, const nlohmann::json& header, const std::string& data) {
  const std::string text = header.dump();
  std::ofstream out(path, std::ios::binary);
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << text << data;
}

class Import : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string m = dir_.file("m.h5");
    write_model_checkpoint(m, preset_config("qwen3-tiny"), random_parameters(preset_config("qwen3-tiny"), 3));
    const CommandResult e = hydra("export --model " + m + " --out " + hf_.string());
    ASSERT_EQ(e.exit_code, 0) << e.output;
  }
  CommandResult import() { return hydra("import --hf " + hf_.string() + " --out " + out_); }
  nlohmann::json config() const {
    std::ifstream in(hf_ / "config.json");
    return nlohmann::json::parse(in);
  }
  void set_config(const nlohmann::json& c) const { std::ofstream(hf_ / "config.json") << c.dump(2); }
  // The export's safetensors header and data section.
  std::pair<nlohmann::json, std::string> parts() const {
    const std::string bytes = read_all((hf_ / "model.safetensors").string());
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
    return {nlohmann::json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
  }
  void expect_refused(const std::string& needle) {
    const CommandResult r = import();
    expect_clean_error(r, needle);
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_FALSE(fs::exists(out_));
  }
  TempDir dir_;
  fs::path hf_ = dir_.path() / "hf";
  std::string out_ = dir_.file("back.h5");
};

TEST_F(Import, TheExportItselfImports) { EXPECT_EQ(import().exit_code, 0); }

// Before: exit 0, and every later load refused the checkpoint.
TEST_F(Import, NonFiniteWeightsAreRefused) {
  auto [header, data] = parts();
  const uint64_t at = header.at("model.norm.weight").at("data_offsets")[0].get<uint64_t>();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ASSERT_EQ(header.at("model.norm.weight").at("dtype"), "F32");
  std::memcpy(data.data() + at, &nan, sizeof(float));
  write_safetensors(hf_ / "model.safetensors", header, data);
  expect_refused("'model.norm.weight' holds NaN or Inf");
  EXPECT_EQ(hydra("import --hf " + hf_.string() + " --allow-nonfinite --out " + out_).exit_code, 0);
}

// Before: the two tensors silently aliased.
TEST_F(Import, OverlappingDataOffsetsAreRefused) {
  auto [header, data] = parts();
  header["model.norm.weight"]["data_offsets"] = header.at("model.layers.0.input_layernorm.weight").at("data_offsets");
  write_safetensors(hf_ / "model.safetensors", header, data);
  expect_refused("overlap in the data section");
}

TEST_F(Import, ATensorNamedTwiceIsRefused) {
  auto [header, data] = parts();
  std::string text = header.dump();
  const std::string entry = "\"model.norm.weight\":" + header.at("model.norm.weight").dump();
  text.insert(1, entry + ",");  // the same key again, first
  std::ofstream out(hf_ / "model.safetensors", std::ios::binary);
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << text << data;
  out.close();
  expect_refused("names tensor 'model.norm.weight' twice");
}

// Before: each dropped without a word.
TEST_F(Import, AnExtraTensorIsRefused) {
  auto [header, data] = parts();
  header["extra.weight"] = {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {data.size(), data.size() + 4}}};
  write_safetensors(hf_ / "model.safetensors", header, data + std::string(4, '\0'));
  expect_refused("1 tensor(s) the config does not use, first 'extra.weight'");
}

TEST_F(Import, FewerLayersInTheConfigThanInTheWeightsAreRefused) {
  nlohmann::json c = config();
  c["num_hidden_layers"] = c.at("num_hidden_layers").get<int>() - 1;
  set_config(c);
  expect_refused("the config does not use, first 'model.layers.");
}

TEST_F(Import, TieFlippedOverAnUntiedHeadIsRefused) {
  nlohmann::json c = config();
  ASSERT_FALSE(c.value("tie_word_embeddings", false));
  c["tie_word_embeddings"] = true;
  set_config(c);
  expect_refused("lm_head.weight differs from model.embed_tokens.weight");
}

// Before: one of the two was picked by directory order.
TEST_F(Import, TwoFilesWithTheSameTensorsAndNoIndexAreRefused) {
  fs::copy_file(hf_ / "model.safetensors", hf_ / "model-old.safetensors");
  expect_refused("and no model.safetensors.index.json says which");
}

// ---- Defects 7 and 8: generate's flags at their limits, inputs it would ignore -------------------

class Generate : public ::testing::Test {
 protected:
  void SetUp() override { write_prompts(prompt_, tokens(20), "prompt_offsets", {0, 8, 20}); }
  CommandResult generate(const std::string& flags) {
    return hydra("generate --preset hydrahead-tiny --prompt " + prompt_ + " --device cpu " + flags);
  }
  TempDir dir_;
  std::string prompt_ = dir_.file("p.h5"), out_ = dir_.file("out.jsonl");
};

// Before: an internal error (exit 1) once prompt + new tokens overflowed.
TEST_F(Generate, MaxNewTokensNearInt64MaxIsAUserError) {
  for (const std::string n : {"9223372036854775807", "9223372036854775790", "1125899906842620"}) {
    SCOPED_TRACE(n);
    expect_clean_error(generate("--max-new-tokens " + n + " --out " + out_), "--max-new-tokens");
    EXPECT_FALSE(fs::exists(out_));
  }
}

// Before: --seed -1 wrapped to 2^64 - 1.
TEST_F(Generate, NegativeSeedsAreRefused) {
  expect_clean_error(generate("--max-new-tokens 2 --temperature 1 --seed -1 --out " + out_),
                     "--seed must be a non-negative integer (got '-1')");
  expect_clean_error(generate("--max-new-tokens 2 --weight-seed -3 --out " + out_), "--weight-seed must be a non-negative");
}

// Before: the prompt file was replaced by the output.
TEST_F(Generate, OutputOverThePromptIsRefused) {
  const std::string before = read_all(prompt_);
  expect_clean_error(generate("--max-new-tokens 2 --out " + prompt_), "an input of this command");
  expect_clean_error(generate("--max-new-tokens 2 --out " + dir_.file("./p.h5")), "is the same file as");
  EXPECT_EQ(read_all(prompt_), before);
}

// Before: one prompt of all the documents, without a word.
TEST_F(Generate, DocumentOffsetsWithoutPromptOffsetsAreRefused) {
  write_prompts(prompt_, tokens(20), "document_offsets", {0, 8, 20});
  expect_clean_error(generate("--max-new-tokens 2 --out " + out_), "has document_offsets but no prompt_offsets");
}

// Before: --top-k / --top-p did nothing at temperature 0.
TEST_F(Generate, FiltersWithoutATemperatureAreRefused) {
  expect_clean_error(generate("--max-new-tokens 2 --top-k 5 --out " + out_), "give --temperature > 0");
  expect_clean_error(generate("--max-new-tokens 2 --top-p 0.5 --out " + out_), "give --temperature > 0");
  EXPECT_EQ(generate("--max-new-tokens 2 --top-k 5 --temperature 0.7 --out " + out_).exit_code, 0);
}

// ---- Defects 3, 4 and 5: training steps that count nothing ---------------------------------------

// Two windows of 64 tokens (129 ids); `counted_window` (0 or 1) is the only one whose targets count.
void write_half_masked(const std::string& path, int counted_window) {
  std::vector<uint8_t> mask(129, 0);
  for (int i = 1 + 64 * counted_window; i <= 64 + 64 * counted_window; ++i) mask[static_cast<size_t>(i)] = 1;
  write_token_data(path, random_tokens(129, 256, 5), mask);
}

std::string train_flags(const std::string& data, const std::string& out_dir, int seed) {
  return fmt::format("train --stage pretrain --preset hydrahead-tiny --data {} --seq-len 64 --steps 2 --device cpu "
                     "--seed {} --out-dir {}", data, seed, out_dir);
}

bool skipped(const std::string& out_dir, int64_t step) {
  for (const auto& j : log_lines(out_dir)) {
    if (j.at("step") == step) return j.contains("skipped");
  }
  return false;
}

// Before: the skip path went past the save: exit 0, no checkpoint, no `latest`.
TEST(TrainSkips, ASkippedLastStepStillSavesTheRun) {
  const TempDir dir;
  write_half_masked(dir.file("d.h5"), 0);
  int last_skipped = 0;
  for (int seed = 0; seed < 6; ++seed) {  // the window order is the seed's: step 2 is the masked one for some
    const std::string out = dir.file(fmt::format("run{}", seed));
    const CommandResult r = hydra(train_flags(dir.file("d.h5"), out, seed));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    last_skipped += skipped(out, 2);
    EXPECT_TRUE(fs::exists(fs::path(out) / "step-000002" / "model.h5")) << "seed " << seed << "\n" << r.output;
    EXPECT_EQ(read_all((fs::path(out) / "latest").string()).substr(0, 11), "step-000002") << "seed " << seed;
  }
  EXPECT_GT(last_skipped, 0) << "no seed skipped the last step: the case was not met";
}

// Before: loss 0.0 and exit 0 (and eval_loss 0.0 from --eval-data of such a file).
TEST(TrainSkips, DataThatCountsNothingIsRefused) {
  const TempDir dir;
  write_token_data(dir.file("zero.h5"), random_tokens(129, 256, 5), std::vector<uint8_t>(129, 0));
  std::vector<int64_t> singles(130);
  for (size_t i = 0; i < singles.size(); ++i) singles[i] = static_cast<int64_t>(i);
  write_token_data(dir.file("ones.h5"), random_tokens(129, 256, 5), {}, singles);  // documents of 1 token
  write_token_file(dir.file("ok.h5"), random_tokens(129, 256, 5));
  for (const std::string data : {"zero.h5", "ones.h5"}) {
    SCOPED_TRACE(data);
    expect_clean_error(hydra(train_flags(dir.file(data), dir.file("run"), 0)), "no target");
    EXPECT_FALSE(fs::exists(dir.file("run")));
    expect_clean_error(hydra(train_flags(dir.file("ok.h5"), dir.file("run"), 0) + " --eval-data " + dir.file(data)),
                       "no target");
    EXPECT_FALSE(fs::exists(dir.file("run")));
  }
}

// Before: 5 of 15 two-rank runs ended "holds the train.jsonl of another run" (rank 0 logged the
// skipped step 1 before rank 1 checked the folder). A race: several runs, each must pass.
TEST(TrainSkips, ASkippedFirstStepOnTwoRanksIsNoRace) {
  const TempDir dir;
  write_half_masked(dir.file("d.h5"), 1);
  for (int run = 0; run < 6; ++run) {
    const std::string out = dir.file(fmt::format("run{}", run));
    // Seed 3 orders the two windows 0, 1: step 1 is the masked window.
    const CommandResult r = run_command("timeout 120 " + mpirun(2) + hydra_binary() + " " +
                                        train_flags(dir.file("d.h5"), out, 3));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(skipped(out, 1)) << "step 1 was not skipped: the case was not met";
    EXPECT_TRUE(fs::exists(fs::path(out) / "step-000002" / "model.h5"));
  }
}

// ---- The new user's list -------------------------------------------------------------------------

// One name for the weights' seed: generate --weight-seed 3 greedy equals forward --weight-seed 3's
// arg-max at the prompt's last position; --seed where it used to be the weight seed is refused.
TEST(NewUser, OneNameForTheWeightSeed) {
  const TempDir dir;
  for (const std::string& cmd : std::vector<std::string>{"forward --preset hydrahead-tiny --seq-len 32 --seed 3",
                                                        "prefill --preset hydrahead-tiny --seq-len 32 --seed 3",
                                                        "init --preset hydrahead-tiny --seed 3 --out " + dir.file("m.h5")}) {
    SCOPED_TRACE(cmd);
    expect_clean_error(hydra(cmd), "the weight seed is --weight-seed");
  }
  EXPECT_FALSE(fs::exists(dir.file("m.h5")));
  // The same seed, the same weights: init --weight-seed 3 and a preset of --weight-seed 3 agree.
  ASSERT_EQ(hydra("init --preset hydrahead-tiny --weight-seed 3 --out " + dir.file("m.h5")).exit_code, 0);
  write_token_file(dir.file("t.h5"), tokens(32));
  const CommandResult a = hydra("forward --preset hydrahead-tiny --weight-seed 3 --input " + dir.file("t.h5"));
  const CommandResult b = hydra("forward --model " + dir.file("m.h5") + " --input " + dir.file("t.h5"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const auto nll = [](const std::string& out) {
    const size_t at = out.find("\"mean_nll\":");
    return at == std::string::npos ? std::string("?") : out.substr(at, 30);
  };
  EXPECT_EQ(nll(a.output), nll(b.output));
}

// The README's output rule: an output that names one of the command's inputs is refused, the input kept.
TEST(NewUser, AnOutputOverAnInputIsRefused) {
  const TempDir dir;
  write_token_file(dir.file("t.h5"), tokens(32));
  const std::string before = read_all(dir.file("t.h5"));
  const std::string t = dir.file("t.h5");
  for (const std::string& cmd : std::vector<std::string>{
           "forward --preset hydrahead-tiny --input " + t + " --output " + t,
           "gradients --preset hydrahead-tiny --input " + t + " --out " + t,
           "eval-lm --preset hydrahead-tiny --data " + t + " --seq-len 16 --out " + t}) {
    SCOPED_TRACE(cmd);
    expect_clean_error(hydra(cmd), "an input of this command");
  }
  EXPECT_EQ(read_all(t), before);
}

TEST(NewUser, BareHydraAndVersion) {
  const CommandResult bare = hydra("");
  EXPECT_EQ(bare.exit_code, 2);
  EXPECT_NE(bare.output.find("hydra: error: no command given"), std::string::npos) << bare.output;
  EXPECT_EQ(bare.output.find("hydra: \n"), std::string::npos) << bare.output;
  const CommandResult v = hydra("--version");
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_EQ(v.output.rfind("hydra 0.", 0), 0u) << v.output;
}

TEST(NewUser, SynthDocLengthMessageNamesDocLength) {
  const TempDir dir;
  const CommandResult r = hydra("synth --task mqar --tokens 4K --seq-len 256 --doc-length 8..200 --vocab 256 --out " +
                                dir.file("d.h5"));
  expect_clean_error(r, "--doc-length 8..200 (its shortest documents, 8 tokens) is too short");
  EXPECT_EQ(r.output.find("--seq-len 256"), std::string::npos) << r.output;
}

// h5py writes numpy bool as an HDF5 enum {FALSE, TRUE} over int8: a loss_mask of it counts as 0/1.
TEST(NewUser, BooleanLossMaskIsRead) {
  const TempDir dir;
  std::vector<uint8_t> mask(129, 1);
  for (size_t i = 0; i < mask.size(); i += 4) mask[i] = 0;
  write_token_data(dir.file("u8.h5"), tokens(129), mask);
  write_token_file(dir.file("bool.h5"), tokens(129));
  {
    const hid_t f = H5Fopen(dir.file("bool.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t type = H5Tenum_create(H5T_NATIVE_INT8);
    int8_t no = 0, yes = 1;
    H5Tenum_insert(type, "FALSE", &no);
    H5Tenum_insert(type, "TRUE", &yes);
    const hsize_t n = mask.size();
    const hid_t space = H5Screate_simple(1, &n, nullptr);
    const hid_t d = H5Dcreate2(f, "loss_mask", type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, mask.data()), 0);
    H5Dclose(d);
    H5Sclose(space);
    H5Tclose(type);
    H5Fclose(f);
  }
  const TokenData data = read_token_data(dir.file("bool.h5"), 256);
  EXPECT_EQ(data.loss_mask, mask);
  const CommandResult a = hydra("forward --preset hydrahead-tiny --input " + dir.file("bool.h5"));
  const CommandResult b = hydra("forward --preset hydrahead-tiny --input " + dir.file("u8.h5"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(a.output.substr(a.output.find("\"mean_nll\"")).substr(0, 40),
            b.output.substr(b.output.find("\"mean_nll\"")).substr(0, 40));
  // Training reads the mask window by window in its stored width (runtime/token_file.h): the same losses.
  const CommandResult ta = hydra(train_flags(dir.file("bool.h5"), dir.file("run_bool"), 1));
  const CommandResult tb = hydra(train_flags(dir.file("u8.h5"), dir.file("run_u8"), 1));
  ASSERT_EQ(ta.exit_code, 0) << ta.output;
  ASSERT_EQ(tb.exit_code, 0) << tb.output;
  EXPECT_EQ(losses(dir.file("run_bool")), losses(dir.file("run_u8")));
  EXPECT_EQ(losses(dir.file("run_bool")).size(), 2u);
}

}  // namespace
}  // namespace hydra::test
