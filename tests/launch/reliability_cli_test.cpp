// The failure cases a user can meet (bad input, interrupted writes), each as a user meets it: inputs that disagree across ranks, values
// that overflow the readers, runaway configs, full disks, interrupted writes, runs that cannot fit in
// memory, non-finite weights, bad fault specs. Every case must end within seconds, exit 2 with a
// one-line error that names the problem, and leave no partial output. Multi-rank cases run under
// mpirun from the test; "one rank reads another file" is made real by starting each rank in its own
// directory holding a different file under the same name (a stale copy on one node).
//
// HYDRA_TEST_BINARY=/path/to/hydra runs these against another build (test_util.h), e.g. an older one
// to see each test fail there.
#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/eval/niah.h"
#include "model/eval/niah_set.h"
#include "model/params.h"
#include "runtime/checkpoint.h"
#include "runtime/hdf5_file.h"
#include "runtime/token_file.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

namespace fs = std::filesystem;

// Every case here must end quickly; a hang is what several of them used to do.
constexpr double kSeconds = 30.0;

// hydra ARGS under a 120 s timeout (a hang ends as exit 124).
CommandResult hydra_timed(const std::string& args) { return run_command("timeout 120 " + hydra_binary() + " " + args); }

// A user error (test_util's expect_user_error) that also came quickly and was no internal error.
void expect_clean_error(const CommandResult& r, const std::string& needle) {
  expect_user_error(r, needle);
  EXPECT_NE(r.exit_code, 124) << "timed out\n" << r.output;
  EXPECT_LT(r.seconds, kSeconds) << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
}

std::vector<int32_t> tokens(int64_t n, int32_t vocab, int32_t salt = 0) { return strided_ids(n, vocab, 37, 11 + salt); }

std::vector<std::string> temporaries_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().find(".tmp-") != std::string::npos) out.push_back(e.path().filename().string());
  }
  return out;
}

// ---- Inputs that disagree across ranks -----------------------------------------------------------

class RankAgreement : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir_.path() / "r0");
    fs::create_directories(dir_.path() / "r1");
  }
  // Writes `config` with weights of `seed` as rR/name for the given ranks.
  void model(const std::string& name, const ModelConfig& config, std::initializer_list<int> ranks) {
    for (int r : ranks)
      write_model_checkpoint(dir_.file(fmt::format("r{}/{}", r, name)), config, random_parameters(config, 3));
  }
  TempDir dir_;
};

// At 371b558: heap corruption ("double free", abort) in the gather of rank 0's logits.
TEST_F(RankAgreement, TokenFileOfAnotherLengthIsRefusedNamingBothRanks) {
  model("m.h5", preset_config("hydrahead-tiny"), {0, 1});
  write_token_file(dir_.file("r0/tokens.h5"), tokens(240, 256));
  write_token_file(dir_.file("r1/tokens.h5"), tokens(120, 256));
  const CommandResult r = hydra_per_rank_dirs(dir_, "forward --model m.h5 --input tokens.h5 --output out.h5");
  expect_clean_error(r,
                    "ranks 0 and 1 disagree on what to run (hydra forward): 'input tokens count' differs "
                    "(rank 0: 240; rank 1: 120)");
  EXPECT_FALSE(fs::exists(dir_.file("r0/out.h5")));
}

TEST_F(RankAgreement, TokensOfTheSameLengthButOtherContentAreRefused) {
  model("m.h5", preset_config("hydrahead-tiny"), {0, 1});
  write_token_file(dir_.file("r0/tokens.h5"), tokens(240, 256));
  write_token_file(dir_.file("r1/tokens.h5"), tokens(240, 256, 1));
  expect_clean_error(hydra_per_rank_dirs(dir_, "forward --model m.h5 --input tokens.h5"), "'input tokens hash' differs");
}

// At 371b558: heap-buffer-overflow in the GDN all-gather (each rank sized it for its own head sets).
TEST_F(RankAgreement, ModelWithOtherFaHeadSetsIsRefused) {
  ModelConfig a = preset_config("hydrahead-tiny"), b = a;
  b.fa_heads = {{0}, {2, 3}};
  model("m.h5", a, {0});
  model("m.h5", b, {1});
  const CommandResult r = hydra_per_rank_dirs(dir_, "forward --model m.h5 --seq-len 240");
  expect_clean_error(r, "'model fa_heads' differs (rank 0: [[1],[2,3]]; rank 1: [[0],[2,3]])");
}

// At 371b558: a hang (the teacher's and the hybrid's collectives do not match).
TEST_F(RankAgreement, TeacherOnOneRankHybridOnTheOtherIsRefused) {
  model("m.h5", preset_config("qwen3-tiny"), {0});
  model("m.h5", preset_config("hydrahead-tiny"), {1});
  const CommandResult r = hydra_per_rank_dirs(dir_, "forward --model m.h5 --seq-len 240");
  expect_clean_error(r, "'model arch' differs (rank 0: \"qwen3\"; rank 1: \"hydrahead\")");
}

TEST_F(RankAgreement, EvalSetThatDiffersOnOneRankIsRefused) {
  const ModelConfig c = preset_config("hydrahead-tiny");
  model("m.h5", c, {0, 1});
  niah::TaskParams p;
  for (int r : {0, 1}) {
    niah::EvalSet set;
    set.task = "single";
    set.samples.push_back(niah::generate_sample(p, c.vocab_size, /*seed=*/static_cast<uint64_t>(r), 256, 50, 0));
    niah::write_eval_set(dir_.file(fmt::format("r{}/set.h5", r)), set);
  }
  const CommandResult r =
      hydra_per_rank_dirs(dir_, "eval-niah --model m.h5 --dataset set.h5 --out r.jsonl --device cpu");
  expect_clean_error(r, "'eval set tokens hash' differs");
  EXPECT_FALSE(fs::exists(dir_.file("r0/r.jsonl")));
}

TEST_F(RankAgreement, OptionGivenOnlyToOneRankIsRefused) {
  model("m.h5", preset_config("hydrahead-tiny"), {0, 1});
  std::ofstream(dir_.file("r0/args")) << "";
  std::ofstream(dir_.file("r1/args")) << "--token-seed 5";
  const CommandResult r = hydra_per_rank_dirs(dir_, "forward --model m.h5 --seq-len 240 $(cat args)");
  expect_clean_error(r, "'option --token-seed' differs (rank 0: 1; rank 1: 5)");
}

// The control: ranks in their own directories with identical copies run normally.
TEST_F(RankAgreement, IdenticalCopiesOnEveryRankRun) {
  model("m.h5", preset_config("hydrahead-tiny"), {0, 1});
  for (int r : {0, 1}) write_token_file(dir_.file(fmt::format("r{}/tokens.h5", r)), tokens(240, 256));
  const CommandResult r = hydra_per_rank_dirs(dir_, "forward --model m.h5 --input tokens.h5 --output out.h5");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir_.file("r0/out.h5")));
}

// At 371b558: silently ignored (no fault is planted, the test that relies on it passes vacuously).
TEST(FaultSpec, UnknownSiteAndMissingRankAreRefused) {
  const std::string run = hydra_binary() + " forward --preset hydrahead-tiny --seq-len 64";
  expect_clean_error(run_command("HYDRA_INJECT_FAULT=0:nowhere " + run),
                    "HYDRA_INJECT_FAULT='0:nowhere': unknown site 'nowhere'");
  expect_clean_error(run_command("HYDRA_INJECT_FAULT=0:kill@nowhere " + run), "unknown site 'kill@nowhere'");
  expect_clean_error(run_command("HYDRA_INJECT_FAULT=layer " + run), "HYDRA_INJECT_FAULT='layer': expected RANK:SITE");
  expect_clean_error(run_command("HYDRA_INJECT_FAULT=x:layer " + run), "'x' is not a rank");
  expect_clean_error(run_command("HYDRA_INJECT_FAULT=2:layer timeout 120 " + mpirun(2) + run),
                    "rank 2 does not exist in a job of 2 rank(s)");
}

// A measurement switch with a value it does not know is refused at start-up, not ignored.
TEST(FaultSpec, UnknownSerialBranchesValueIsRefused) {
  const std::string run = hydra_binary() + " forward --preset hydrahead-tiny --seq-len 64";
  expect_clean_error(run_command("HYDRA_SERIAL_BRANCHES=yes " + run), "HYDRA_SERIAL_BRANCHES must be 0 or 1 (got 'yes')");
  const CommandResult ok = run_command("HYDRA_SERIAL_BRANCHES=1 " + run);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
}

// Every kernel option is read once at start-up (launch/kernel_options.cpp) and refused there with
// the variable's name when its value is unknown, on the CPU path too (before any work).
TEST(FaultSpec, UnknownKernelOptionValuesAreRefused) {
  const std::string run = hydra_binary() + " forward --preset hydrahead-tiny --seq-len 64";
  expect_clean_error(run_command("HYDRA_ATTENTION_KERNEL=wgmma " + run),
                     "HYDRA_ATTENTION_KERNEL must be hopper or mma (got 'wgmma')");
  expect_clean_error(run_command("HYDRA_ATTENTION_BWD_KERNEL=fast " + run),
                     "HYDRA_ATTENTION_BWD_KERNEL must be ws, mma or mma-k64 (got 'fast')");
  expect_clean_error(run_command("HYDRA_GDN_SEGMENTS=0 " + run), "HYDRA_GDN_SEGMENTS must be an integer from 1 to 4096");
  expect_clean_error(run_command("HYDRA_GDN_SEGMENTS=3x " + run), "(got '3x')");
  expect_clean_error(run_command("HYDRA_GDN_PROFILE=yes " + run), "HYDRA_GDN_PROFILE must be 0, 1 or 2 (got 'yes')");
  expect_clean_error(run_command("HYDRA_DECODE_PDL=on " + run), "HYDRA_DECODE_PDL must be 0 or 1 (got 'on')");
  expect_clean_error(run_command("HYDRA_DECODE_GEMV=fast " + run), "HYDRA_DECODE_GEMV must be cublas, hydra or hydra-norm (got 'fast')");
  expect_clean_error(run_command("HYDRA_SMALL_ROWS=yes " + run), "HYDRA_SMALL_ROWS must be 0 or 1 (got 'yes')");
  const std::string prefetch = "HYDRA_DECODE_PREFETCH must be off or a whole number of MiB from 1 to 1024";
  for (const std::string bad : {"on", "32MB", "2048", "-1", "+8", " 8", "1e3", "99999999999999999999"}) {
    expect_clean_error(run_command("HYDRA_DECODE_PREFETCH='" + bad + "' " + run), prefetch + " (got '" + bad + "')");
  }
  const CommandResult ok = run_command("HYDRA_ATTENTION_KERNEL=mma HYDRA_ATTENTION_BWD_KERNEL=mma HYDRA_GDN_SEGMENTS=2 "
                                       "HYDRA_GDN_PROFILE=0 HYDRA_DECODE_PDL=1 HYDRA_DECODE_GEMV=hydra-norm "
                                       "HYDRA_DECODE_PREFETCH=32 HYDRA_SMALL_ROWS=1 " + run);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
}

// The decode bench's kernel variants (--decode-ctas-per-sm, --decode-gemv, --gdn-step,
// --decode-prefetch) are refused
// with the flag's name when a value is unknown, before any GPU is asked for; valid lists get as far
// as the GPU (a build or machine without one then says so).
TEST(FaultSpec, UnknownDecodeKernelVariantsAreRefused) {
  const std::string run = hydra_binary() + " bench --op decode --preset hydrahead-tiny --contexts 4K --batches 1";
  expect_clean_error(run_command(run + " --decode-ctas-per-sm 2,x"), "--decode-ctas-per-sm takes integers from 0 to 64 (got 'x')");
  expect_clean_error(run_command(run + " --decode-ctas-per-sm 65"), "--decode-ctas-per-sm takes integers from 0 to 64 (got '65')");
  expect_clean_error(run_command(run + " --decode-gemv cublas,fast"), "--decode-gemv takes cublas, hydra and/or hydra-norm (got 'fast')");
  expect_clean_error(run_command(run + " --decode-gemv ,hydra"), "--decode-gemv takes cublas, hydra and/or hydra-norm (got '')");
  expect_clean_error(run_command(run + " --gdn-step separate,fast"), "--gdn-step takes separate and/or fused (got 'fast')");
  const std::string prefetch = "--decode-prefetch must be off or a whole number of MiB from 1 to 1024";
  expect_clean_error(run_command(run + " --decode-prefetch off,fast"), prefetch + " (got 'fast')");
  expect_clean_error(run_command(run + " --decode-prefetch off,,8"), prefetch + " (got '')");
  expect_clean_error(run_command(run + " --decode-prefetch 4096"), prefetch + " (got '4096')");
  expect_clean_error(run_command("HYDRA_DECODE_PREFETCH=x " + run + " --decode-prefetch 8"),
                     "HYDRA_DECODE_PREFETCH must be off or a whole number of MiB from 1 to 1024 (got 'x')");
  const CommandResult ok = run_command("CUDA_VISIBLE_DEVICES= " + run +
                                       " --decode-ctas-per-sm 0,2,4 --decode-gemv cublas,hydra,hydra-norm --gdn-step separate,fused"
                                       " --decode-prefetch off,0,8,32,48,1024");
  EXPECT_NE(ok.exit_code, 0);
  EXPECT_TRUE(ok.output.find("needs a CUDA device") != std::string::npos || ok.output.find("HYDRA_CUDA=OFF") != std::string::npos)
      << ok.output;
}

// ---- Readers: overflowing and impossible values ----------------------------------------------------

// An eval set with one sample whose answer_start / answer_length are set by hand (bypassing
// write_eval_set's checks), as a damaged or hostile file would have them.
void write_raw_eval_set(const std::string& path, int64_t answer_start, int64_t answer_length) {
  const std::vector<int32_t> ids = tokens(256, 248);
  H5File f = H5File::create(path);
  f.set_attribute("format", std::string(niah::kEvalSetFormat));
  f.set_attribute("format_version", niah::kEvalSetVersion);
  f.set_attribute("task", std::string("single"));
  const auto ints = [&](const std::string& name, std::vector<int64_t> v) {
    f.write(name, TensorView(v.data(), DType::i64, Device::host, {static_cast<int64_t>(v.size())}));
  };
  f.write("input_ids", TensorView(const_cast<int32_t*>(ids.data()), DType::i32, Device::host, {256}));
  ints("sample_offset", {0, 256});
  ints("answer_start", {answer_start});
  ints("answer_length", {answer_length});
  ints("length", {256});
  ints("depth", {50});
  f.close();
}

// At 371b558: near 2^62 the sum start + length wrapped past the bounds check and eval-niah hung;
// near 2^63 it ended with an internal error ("answer row owned by 0 ranks").
TEST(ReaderBounds, NiahAnswerSpansNear2To62And2To63AreUserErrors) {
  TempDir dir;
  const int64_t near62 = (int64_t{1} << 62) + 5, near63 = INT64_MAX - 3;
  for (const auto& [start, length] :
       {std::pair{near62, near62}, std::pair{int64_t{10}, near63}, std::pair{near63, int64_t{10}}}) {
    write_raw_eval_set(dir.file("bad.h5"), start, length);
    const CommandResult r = hydra_timed("eval-niah --preset hydrahead-tiny --dataset " + dir.file("bad.h5") + " --out " +
                                  dir.file("r.jsonl") + " --device cpu");
    expect_clean_error(r, "sample 0: answer [" + std::to_string(start) + ", ");
    EXPECT_LT(r.seconds, 5.0) << r.output;
    EXPECT_FALSE(fs::exists(dir.file("r.jsonl")));
  }
}

// At 371b558: > 60 s and 10 GB building parameter specs, then bad_alloc.
TEST(ReaderBounds, RunawayLayerCountFailsInMilliseconds) {
  TempDir dir;
  nlohmann::json config = config_to_json(preset_config("qwen3-tiny"));
  config["num_hidden_layers"] = 1e7;
  write_checkpoint(dir.file("m.h5"), config.dump(), {});
  for (const std::string& command :
       {std::string("info ") + dir.file("m.h5"), "forward --model " + dir.file("m.h5") + " --seq-len 64",
        "convert --teacher " + dir.file("m.h5") + " --fa-heads uniform:1 --out " + dir.file("s.h5")}) {
    const CommandResult r = hydra_timed(command);
    expect_clean_error(r, "num_hidden_layers must be in 1..16384 (got 10000000)");
    EXPECT_LT(r.seconds, 5.0) << r.output;
  }
  config["num_hidden_layers"] = 2;
  config["hidden_size"] = 1e300;  // a float that get<int64_t>() would convert with undefined behaviour
  write_checkpoint(dir.file("m.h5"), config.dump(), {});
  expect_clean_error(hydra_timed("info " + dir.file("m.h5")), "hidden_size: 1e+300 is not an integer");
}

// At 371b558: "internal error" (an assertion while formatting the message), exit 1.
TEST(ReaderBounds, ConfigThatIsNotJsonIsAUserError) {
  TempDir dir;
  write_checkpoint(dir.file("m.h5"), "{not json", {});
  expect_clean_error(hydra_timed("info " + dir.file("m.h5")), "the 'config' attribute is not JSON");
  expect_clean_error(hydra_timed("convert --teacher " + dir.file("m.h5") + " --fa-heads uniform:1 --out " + dir.file("s.h5")),
                    "the 'config' attribute is not JSON");
}

// An HF folder: the fixture's config.json and a safetensors file written here.
void write_safetensors(const std::string& path, const std::string& header, size_t data_bytes = 0) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << std::string(data_bytes, '\0');
}

TEST(ReaderBounds, SafetensorsIndexWithANonStringValueIsAUserError) {
  TempDir dir;
  fs::copy_file(fixture_dir() + "/hf/mha_tied/config.json", dir.file("config.json"));
  std::ofstream(dir.file("model.safetensors.index.json")) << R"({"weight_map": {"model.embed_tokens.weight": 5}})";
  expect_clean_error(hydra_timed("import --hf " + dir.path().string() + " --out " + dir.file("m.h5")),
                    "weight_map['model.embed_tokens.weight'] is 5, not a file name");
  std::ofstream(dir.file("model.safetensors.index.json")) << R"({"weight_map": {"model.embed_tokens.weight": "../x"}})";
  expect_clean_error(hydra_timed("import --hf " + dir.path().string() + " --out " + dir.file("m.h5")),
                    "is not a file name in the");
  EXPECT_FALSE(fs::exists(dir.file("m.h5")));
}

TEST(ReaderBounds, SafetensorsNegativeOrHugeShapeIsAUserError) {
  TempDir dir;
  fs::copy_file(fixture_dir() + "/hf/mha_tied/config.json", dir.file("config.json"));
  write_safetensors(dir.file("model.safetensors"),
                    R"({"model.embed_tokens.weight": {"dtype": "F32", "shape": [-48], "data_offsets": [0, 0]}})");
  expect_clean_error(hydra_timed("import --hf " + dir.path().string() + " --out " + dir.file("m.h5")),
                    "tensor 'model.embed_tokens.weight' has shape [-48] (negative or too large)");
  write_safetensors(dir.file("model.safetensors"),
                    R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 16]}})", 16);
  expect_clean_error(hydra_timed("import --hf " + dir.path().string() + " --out " + dir.file("m.h5")),
                    "(negative or too large)");
  write_safetensors(dir.file("model.safetensors"),
                    R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [1e300, 16]}})", 16);
  expect_clean_error(hydra_timed("import --hf " + dir.path().string() + " --out " + dir.file("m.h5")), "is not an integer");
}

// ---- Full disks -------------------------------------------------------------------------------------

// Runs `args` with writes limited to `kib` KiB per file (RLIMIT_FSIZE: a write past it fails with
// EFBIG, as on a full disk; SIGXFSZ ignored so the write returns the error). Open MPI's own
// shared-memory files obey the limit too, so its dstore and shared-memory transport are switched off.
CommandResult hydra_with_file_limit(int kib, const std::string& args) {
  return run_command("timeout 120 env PMIX_MCA_gds=hash OMPI_MCA_btl=self bash -c \"trap '' XFSZ; ulimit -f " +
                     std::to_string(kib) + "; exec " + hydra_binary() + " " + args + "\"");
}

// At 371b558: the error, then a segfault at exit (H5Fclose skipped after the failed flush), and the
// JSON lines committed without their HDF5 copy.
TEST(FullDisk, EvalNiahFailsCleanlyAndWritesNeitherOutput) {
  TempDir dir;
  const std::string args =
      "eval-niah --preset hydrahead-tiny --lengths 256 --depths 0,50 --samples 1 --device cpu --out " +
      dir.file("r.jsonl");
  const CommandResult r = hydra_with_file_limit(8, args);  // the JSON lines fit, the HDF5 copy (~11 KB) does not
  expect_clean_error(r, "writing the HDF5 file failed (disk full or over a file size limit?)");
  EXPECT_FALSE(fs::exists(dir.file("r.jsonl")));
  EXPECT_FALSE(fs::exists(dir.file("r.h5")));
  EXPECT_TRUE(temporaries_in(dir.path()).empty());
}

// At 371b558: heads.json committed, heads.h5 not (and the segfault at exit).
TEST(FullDisk, SelectHeadsWritesBothFilesOrNeither) {
  TempDir dir;
  const std::string args =
      "select-heads --preset qwen3-tiny --calib-length 64 --calib-samples 2 --lm-length 32 "
      "--device cpu --out " +
      dir.file("heads.json");
  // A first run (no limit) leaves a pair; a second one with another budget fails to write and must
  // leave that pair exactly as it was.
  ASSERT_EQ(hydra_timed(args + " --budget 2").exit_code, 0);
  const std::string json_before = read_all(dir.file("heads.json")), h5_before = read_all(dir.file("heads.h5"));
  const CommandResult r = hydra_with_file_limit(4, args + " --budget 3");  // heads.json fits, heads.h5 (~6 KB) not
  expect_clean_error(r, "writing the HDF5 file failed");
  EXPECT_EQ(read_all(dir.file("heads.json")), json_before);
  EXPECT_EQ(read_all(dir.file("heads.h5")), h5_before);
  EXPECT_TRUE(temporaries_in(dir.path()).empty());
}

// ---- Interrupted writes -----------------------------------------------------------------------------

class InterruptedWrite : public ::testing::Test {
 protected:
  void SetUp() override {
    const ModelConfig c = preset_config("qwen3-tiny");
    write_model_checkpoint(dir_.file("teacher.h5"), c, random_parameters(c, 4));
    write_model_checkpoint(dir_.file("student.h5"), preset_config("hydrahead-tiny"),
                           random_parameters(preset_config("hydrahead-tiny"), 5));
    before_ = read_all(dir_.file("student.h5"));
  }
  std::string convert() const {
    return hydra_binary() + " convert --teacher " + dir_.file("teacher.h5") + " --fa-heads uniform:1 --out " +
           dir_.file("student.h5");
  }
  TempDir dir_;
  std::string before_;
};

// At 371b558 (the SIGTERM of a time limit): `.student.h5.tmp-PID` stayed behind, as large as a checkpoint.
TEST_F(InterruptedWrite, SigtermDuringACheckpointWriteRemovesTheTemporary) {
  const CommandResult r = run_command("HYDRA_INJECT_FAULT=0:term@commit " + convert());
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.output;  // ended by the signal, as before the handler ran
  EXPECT_TRUE(temporaries_in(dir_.path()).empty()) << temporaries_in(dir_.path()).front();
  EXPECT_EQ(read_all(dir_.file("student.h5")), before_) << "the target must be untouched";
}

TEST_F(InterruptedWrite, KillDuringACheckpointWriteIsSweptByTheNextWrite) {
  const CommandResult killed = run_command("HYDRA_INJECT_FAULT=0:kill@commit " + convert());
  EXPECT_EQ(killed.exit_code, 128 + SIGKILL) << killed.output;
  ASSERT_EQ(temporaries_in(dir_.path()).size(), 1u) << "kill -9 cannot be caught: the temporary stays";
  EXPECT_EQ(read_all(dir_.file("student.h5")), before_);
  // Another process's temporary of an unrelated name is not touched; a live process's neither.
  std::ofstream(dir_.file(".other.h5.tmp-4999999")) << "x";
  std::ofstream(dir_.file(".student.h5.tmp-" + std::to_string(getppid()))) << "x";
  const CommandResult again = run_command(convert());
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("a temporary left by a process that no longer exists"), std::string::npos)
      << again.output;
  std::vector<std::string> left = temporaries_in(dir_.path());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{".other.h5.tmp-4999999", ".student.h5.tmp-" + std::to_string(getppid())}));
}

// Starts `hydra ARGS...` with its output discarded; returns its pid.
pid_t spawn_hydra(const std::vector<std::string>& args) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    std::vector<char*> argv;
    const std::string binary = hydra_binary();
    argv.push_back(const_cast<char*>(binary.c_str()));
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

// At 2fc8691: SIGTERM about 2 s into `hydra init --preset qwen3-1.7b --out big.h5` left
// `.big.h5.tmp-PID` behind in about 1 run of 15 under `timeout`, which signals the process and then
// its process group (scancel and a terminal's Ctrl-C also reach a process more than once). The
// handler reset the disposition on entry (SA_RESETHAND), so a second signal taken by another thread
// of the process (MPI's, the BLAS pool's) while the first was being handled ended the process before
// the temporary was removed. Two forms at several moments of the write: two SIGTERMs back to back;
// and one SIGTERM to every thread at once (sent while the process is stopped, so that they arrive
// together: at 2fc8691 that left the temporary in 8 runs of 10).
TEST(InterruptedInit, SigtermsAtAnyMomentOfALargeInitLeaveNothing) {
  TempDir dir;
  const std::string out = dir.file("big.h5");
  for (const bool every_thread : {false, true}) {
    for (const int delay_ms : {400, 800, 1200, 1600, 2000, 2400}) {
      const pid_t pid = spawn_hydra({"init", "--preset", "qwen3-1.7b", "--out", out});
      ASSERT_GT(pid, 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      if (every_thread) {
        kill(pid, SIGSTOP);
        for (const fs::directory_entry& task : fs::directory_iterator(fmt::format("/proc/{}/task", pid))) {
          syscall(SYS_tgkill, pid, std::stol(task.path().filename().string()), SIGTERM);
        }
        kill(pid, SIGCONT);
      } else {
        kill(pid, SIGTERM);
        kill(pid, SIGTERM);
      }
      int status = 0;
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
      const std::string form = fmt::format("{} after {} ms", every_thread ? "SIGTERM to every thread" : "two SIGTERMs",
                                           delay_ms);
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << form << ": status " << status;
      const std::vector<std::string> left = temporaries_in(dir.path());
      EXPECT_TRUE(left.empty()) << form << ": " << left.front() << " left behind";
      for (const fs::directory_entry& e : fs::directory_iterator(dir.path())) fs::remove_all(e.path());
    }
  }
}

// Since training saves on a signal, a first SIGTERM asks training to save and stop after the step (runtime/stop_request.h):
// here it arrives during step 1's save, which completes; step 2 then stops the run and saves, and the
// SIGTERM of that save (a second signal) ends the process at once, removing the step being written.
TEST(InterruptedTraining, SigtermDuringASaveLeavesNoStepDirectory) {
  TempDir dir;
  write_token_file(dir.file("data.h5"), tokens(2048, 256));
  const std::string out = dir.file("run");
  const CommandResult r = run_command("HYDRA_INJECT_FAULT=0:term@save " + hydra_binary() +
                                      " train --stage pretrain --preset qwen3-tiny --data " + dir.file("data.h5") +
                                      " --seq-len 64 --steps 4 --save-every 1 --out-dir " + out);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.output;
  ASSERT_TRUE(fs::is_directory(out));
  EXPECT_TRUE(temporaries_in(out).empty()) << temporaries_in(out).front();
  std::ifstream latest(fs::path(out) / "latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step-000001");
  EXPECT_FALSE(fs::exists(fs::path(out) / "step-000002"));
}

// ---- Memory plans on the CPU path ---------------------------------------------------------------

// At 371b558: "internal error: host allocation of N bytes failed" after up to a minute.
TEST(MemoryPlan, CpuRunsThatCannotFitAreRefusedUpFront) {
  // 16G tokens: terabytes of activations, more than any host has.
  for (const std::string& command : {std::string("forward --preset hydrahead-tiny --seq-len 16G"),
                                     std::string("prefill --preset hydrahead-tiny --seq-len 16G --device cpu")}) {
    const CommandResult r = hydra_timed(command);
    expect_clean_error(r, "17179869184 tokens on 1 rank(s) needs about ");
    EXPECT_NE(r.output.find("GiB available"), std::string::npos) << r.output;
    EXPECT_LT(r.seconds, 10.0) << r.output;
  }
}

// ---- Non-finite values --------------------------------------------------------------------------

class NonFiniteWeights : public ::testing::Test {
 protected:
  void SetUp() override {
    const ModelConfig c = preset_config("hydrahead-tiny");
    NamedTensors p = random_parameters(c, 6);
    p.at("model.layers.1.self_attn.o_proj.weight").data_as<float>()[5] = NAN;
    write_model_checkpoint(dir_.file("nan.h5"), c, p);
    write_token_file(dir_.file("tokens.h5"), tokens(64, 256));
  }
  TempDir dir_;
};

// At 371b558: forward printed "mean_nll": null, eval-niah accuracy 0, both with exit 0.
TEST_F(NonFiniteWeights, AreRefusedAtLoadNamingTheTensor) {
  const std::string tensor = "tensor 'model.layers.1.self_attn.o_proj.weight' holds NaN or Inf (first at element 5";
  expect_clean_error(hydra_timed("forward --model " + dir_.file("nan.h5") + " --input " + dir_.file("tokens.h5")), tensor);
  expect_clean_error(hydra_timed("eval-niah --model " + dir_.file("nan.h5") +
                          " --lengths 256 --depths 50 --samples 1 --device cpu "
                          "--out " +
                          dir_.file("r.jsonl")),
                    tensor);
  EXPECT_FALSE(fs::exists(dir_.file("r.jsonl")));
}

TEST_F(NonFiniteWeights, AllowNonfiniteRunsAndNamesTheFirstLayerThatTurnsNonFinite) {
  const CommandResult r = hydra_timed("forward --allow-nonfinite --model " + dir_.file("nan.h5") + " --input " +
                                dir_.file("tokens.h5") + " --output " + dir_.file("logits.h5"));
  expect_clean_error(r, "the first non-finite value appears in the output of layer 1 (first on rank 0, position 0)");
  EXPECT_FALSE(fs::exists(dir_.file("logits.h5")));
  // The same on 2 ranks: the earliest stage over both.
  const CommandResult p =
      run_command("timeout 120 " + mpirun(2) + hydra_binary() + " forward --allow-nonfinite --model " +
                  dir_.file("nan.h5") + " --input " + dir_.file("tokens.h5"));
  expect_clean_error(p, "appears in the output of layer 1 (first on rank 0, position 0)");
}

TEST_F(NonFiniteWeights, OverflowFromFiniteWeightsNamesTheLayer) {
  const ModelConfig c = preset_config("qwen3-tiny");
  NamedTensors p = random_parameters(c, 7);
  // Finite weights whose products are not: gate and up projections of 1e20 make the MLP's
  // SiLU(g)·u about 1e42, beyond float32.
  for (const char* name : {"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"}) {
    Tensor& w = p.at(name);
    for (int64_t i = 0; i < w.numel(); ++i) w.data_as<float>()[i] = 1e20f;
  }
  write_model_checkpoint(dir_.file("big.h5"), c, p);
  expect_clean_error(hydra_timed("forward --model " + dir_.file("big.h5") + " --input " + dir_.file("tokens.h5")),
                    "appears in the output of layer 0");
}

// At 371b558: gamma = NaN written into the student, exit 0.
TEST_F(NonFiniteWeights, NanTeacherIsRefusedByConvertAndNoStudentIsWritten) {
  const ModelConfig c = preset_config("qwen3-tiny");
  NamedTensors p = random_parameters(c, 8);
  p.at("model.layers.0.self_attn.v_proj.weight").data_as<float>()[0] = INFINITY;
  write_model_checkpoint(dir_.file("teacher.h5"), c, p);
  const std::string convert = "convert --teacher " + dir_.file("teacher.h5") + " --fa-heads uniform:1 --calib " +
                              dir_.file("tokens.h5") + " --out " + dir_.file("student.h5");
  expect_clean_error(hydra_timed(convert), "tensor 'model.layers.0.self_attn.v_proj.weight' holds NaN or Inf");
  expect_clean_error(
      hydra_timed(convert + " --allow-nonfinite"),
      "convert: the teacher's head RMS (gamma) over --calib is not finite (NaN or Inf): the first non-finite "
      "value appears in the output of layer 0");
  EXPECT_FALSE(fs::exists(dir_.file("student.h5")));
}

TEST(NonFiniteTraining, NanLossStopsTheRunAtItsStepWithTheLastGoodCheckpointIntact) {
  TempDir dir;
  write_token_file(dir.file("data.h5"), tokens(4096, 256));
  const std::string out = dir.file("run");
  // A learning rate of 1e30 makes step 1's update blow the weights up; step 2's loss is NaN.
  const CommandResult r =
      hydra_timed("train --stage pretrain --preset qwen3-tiny --data " + dir.file("data.h5") +
            " --seq-len 64 --steps 4 --warmup 0 --lr 1e30 --grad-clip 0 --save-every 1 --out-dir " + out);
  expect_clean_error(r, "step 2: the loss is");
  EXPECT_NE(r.output.find("The last good checkpoint is " + out + "/step-000001"), std::string::npos) << r.output;
  std::ifstream latest(fs::path(out) / "latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step-000001");
  EXPECT_FALSE(fs::exists(fs::path(out) / "step-000002"));
  // The checkpoint step 1 wrote is whole and loads (its weights are finite: the NaN came later).
  const CommandResult info = hydra_timed("info " + out + "/step-000001/model.h5");
  EXPECT_EQ(info.exit_code, 0) << info.output;
}

}  // namespace
}  // namespace hydra::test
