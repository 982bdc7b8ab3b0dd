// hydra train on a cluster, as a user meets it: a signal before the time limit saves the
// last completed step and exits 75 (every rank agreeing, even when one rank alone was signalled);
// ranks holding other bytes under the same path are named before the first collective; --resume
// refuses other inputs and a damaged state; invalid numbers, unusable --out-dir and a log that cannot
// be written are one-line errors; the CPU path prints no meaningless figures.
//
// HYDRA_TEST_BINARY=/path/to/hydra runs these against another build (test_util.h), e.g. an older one
// to see each test fail there.
#include <hdf5.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model/params.h"
#include "runtime/checkpoint.h"
#include "runtime/content_hash.h"
#include "runtime/token_file.h"
#include "tests/common/test_util.h"
#include "tests/launch/train_log.h"

namespace hydra::test {
namespace {

namespace fs = std::filesystem;

std::string latest_of(const std::string& out_dir) {
  std::ifstream in(fs::path(out_dir) / "latest");
  std::string name;
  in >> name;
  return name;
}

// The line after "Continue with:" in a stopped run's output; "" unless it names the binary that ran
// (at 6777ccb it printed `hydra`, which is not on PATH where the binary was started by its path).
std::string printed_resume_command(const std::string& output) {
  const size_t at = output.find("Continue with:");
  if (at == std::string::npos) return "";
  const size_t start = output.find_first_not_of(" \n", output.find('\n', at));
  std::string line = output.substr(start, output.find('\n', start) - start);
  return line.find(hydra_binary() + " train") == std::string::npos ? "" : line;
}

class Resilience : public ::testing::Test {
 protected:
  std::string write_model(const std::string& name, const std::string& preset, uint64_t seed) {
    const std::string path = dir_.file(name);
    fs::create_directories(fs::path(path).parent_path());
    const ModelConfig c = preset_config(preset);
    write_model_checkpoint(path, c, random_parameters(c, seed));
    return path;
  }
  std::string write_tokens(const std::string& name, int64_t n, uint64_t seed) {
    const std::string path = dir_.file(name);
    fs::create_directories(fs::path(path).parent_path());
    write_token_file(path, random_tokens(n, 256, seed));
    return path;
  }
  TempDir dir_;
};

// ---- Signals -------------------------------------------------------------------------------------

// At 2fc8691: SIGTERM ended the run with 143, no message, no checkpoint (--save-every 0).
TEST_F(Resilience, SigtermSavesTheLastStepAndTheResumeEndsLikeAnUninterruptedRun) {
  const std::string model = write_model("m.h5", "hydrahead-tiny", 3), data = write_tokens("d.h5", 12 * 64 + 1, 4);
  const std::string common = " --stage pretrain --model " + model + " --data " + data +
                             " --seq-len 64 --steps 60 --device cpu --seed 2 --out-dir ";
  const std::string whole = dir_.file("whole"), cut = dir_.file("cut");
  const CommandResult w = hydra("train" + common + whole);
  ASSERT_EQ(w.exit_code, 0) << w.output;
  // The run in the background; SIGTERM once its first step is logged (as Slurm's warning would come).
  const std::string log = dir_.file("cut.log");
  const CommandResult r = run_command(
      "bash -c '" + hydra_binary() + " train" + common + cut + " > " + log + " 2>&1 & pid=$!; " +
      "for i in $(seq 1200); do grep -q \"step 1/60\" " + log + " && break; sleep 0.05; done; kill -TERM $pid; " +
      "wait $pid; code=$?; cat " + log + "; exit $code'");
  ASSERT_EQ(r.exit_code, 75) << r.output;
  EXPECT_NE(r.output.find("stopped by SIGTERM after step"), std::string::npos) << r.output;
  const std::string step = latest_of(cut);
  ASSERT_FALSE(step.empty()) << "no checkpoint after the signal\n" << r.output;
  EXPECT_TRUE(fs::exists(fs::path(cut) / step / "manifest.json"));
  EXPECT_TRUE(fs::exists(fs::path(cut) / step / "shard-00000-of-00001.h5"));
  EXPECT_NE(r.output.find("saved " + (fs::path(cut) / step).string() + " ("), std::string::npos) << r.output;
  const size_t stopped_at = losses(cut).size();
  EXPECT_GE(stopped_at, 1u);
  EXPECT_LT(stopped_at, 60u);
  EXPECT_EQ(step, fmt::format("step-{:06d}", stopped_at));
  // The printed command continues the run; it ends with the uninterrupted run's losses, bit for bit.
  const std::string resume = printed_resume_command(r.output);
  ASSERT_NE(resume.find("--resume"), std::string::npos) << r.output;
  const CommandResult b = run_command(resume);
  ASSERT_EQ(b.exit_code, 0) << resume << "\n" << b.output;
  EXPECT_EQ(losses(cut), losses(whole));
  EXPECT_EQ(nlohmann::json::parse(b.output.substr(b.output.rfind("{\"command\""))).at("loss"),
            nlohmann::json::parse(w.output.substr(w.output.rfind("{\"command\""))).at("loss"));
}

// SIGTERM to cluster/launch.sh (what a batch system sends the job's script at the end of an
// allocation): the ranks get it as SIGUSR1 through mpirun, save their step, and the script exits 75,
// EX_TEMPFAIL (at 6777ccb SIGTERM reached mpirun itself, which ends the job on its own terms and
// exits 1 whatever the ranks did; README "Time limits and signals").
TEST_F(Resilience, SigtermToTheLaunchScriptSavesAndExits75) {
  const std::string model = write_model("m.h5", "hydrahead-tiny", 3), data = write_tokens("d.h5", 12 * 64 + 1, 4);
  const std::string cut = dir_.file("cut"), log = dir_.file("launch.log");
  const std::string launch = fixture_dir() + "/../../cluster/launch.sh";
  const CommandResult r = run_command(
      "bash -c 'OMPI_MCA_rmaps_base_oversubscribe=1 " + launch + " -g 2 -- " + hydra_binary() + " train --stage pretrain "
      "--model " + model + " --data " + data + " --seq-len 64 --steps 60 --sp 1 --device cpu --out-dir " + cut + " > " +
      log + " 2>&1 & pid=$!; for i in $(seq 2400); do grep -q \"step 1/60\" " + log + " && break; sleep 0.05; done; "
      "kill -TERM $pid; wait $pid; code=$?; cat " + log + "; exit $code'");
  ASSERT_EQ(r.exit_code, 75) << r.output;
  EXPECT_NE(r.output.find("stopped by SIGUSR1 after step"), std::string::npos) << r.output;
  const std::string step = latest_of(cut);
  ASSERT_FALSE(step.empty()) << r.output;
  EXPECT_TRUE(fs::exists(fs::path(cut) / step / "manifest.json"));
  EXPECT_NE(r.output.find("mpirun -np 2 " + hydra_binary() + " train"), std::string::npos) << r.output;
}

// One rank alone receives the signal (HYDRA_INJECT_FAULT=1:term@step): both ranks stop after the
// same step, the checkpoint is complete, and the resumed job ends like an uninterrupted one.
TEST_F(Resilience, SignalOnOneRankStopsEveryRankAfterTheSameStep) {
  const std::string model = write_model("m.h5", "hydrahead-tiny", 5), data = write_tokens("d.h5", 8 * 64 + 1, 6);
  const std::string common = " train --stage pretrain --model " + model + " --data " + data +
                             " --seq-len 64 --steps 4 --sp 1 --device cpu --out-dir ";
  const std::string whole = dir_.file("whole"), cut = dir_.file("cut");
  ASSERT_EQ(run_command("timeout 120 " + mpirun(2) + hydra_binary() + common + whole).exit_code, 0);
  const CommandResult r =
      run_command("HYDRA_INJECT_FAULT=1:term@step timeout 120 " + mpirun(2) + hydra_binary() + common + cut);
  EXPECT_EQ(r.exit_code, 75) << r.output;
  EXPECT_NE(r.output.find("stopped by a signal on another rank after step 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mpirun -np 2 " + hydra_binary() + " train"), std::string::npos) << r.output;
  EXPECT_EQ(latest_of(cut), "step-000001");
  const CommandResult b = run_command("timeout 120 " + mpirun(2) + hydra_binary() + common + cut + " --resume");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(losses(cut), losses(whole));
}

// ---- Content fingerprints ------------------------------------------------------------------------

// `args` on 2 ranks, rank r started in DIR/rR (relative paths are that rank's own files).
CommandResult per_rank_dirs(const TempDir& dir, const std::string& args) {
  return run_command("timeout 120 " + mpirun(2) + "sh -c 'cd " + dir.path().string() +
                     "/r$OMPI_COMM_WORLD_RANK && exec " + hydra_binary() + " " + args + "'");
}

// At 2fc8691: a stale m.h5 (same shapes, other weights) or a data file with one token changed on one
// rank trained on mixed inputs and exited 0.
TEST_F(Resilience, RankWithOtherBytesUnderTheSamePathIsNamed) {
  write_model("r0/m.h5", "hydrahead-tiny", 1);
  write_model("r1/m.h5", "hydrahead-tiny", 2);
  write_tokens("r0/d.h5", 4 * 64 + 1, 3);
  write_tokens("r1/d.h5", 4 * 64 + 1, 3);
  const std::string args = "train --stage pretrain --model m.h5 --data d.h5 --seq-len 64 --steps 1 --sp 1 --device cpu "
                           "--out-dir " + dir_.file("out");
  CommandResult r = per_rank_dirs(dir_, args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("ranks 0 and 1 disagree on what to run (hydra train): 'contents of the model m.h5' differs"),
            std::string::npos) << r.output;
  // A copy: HDF5 stores object times, so the same tensors written again are other bytes.
  fs::copy_file(dir_.file("r0/m.h5"), dir_.file("r1/m.h5"), fs::copy_options::overwrite_existing);
  std::vector<int32_t> ids = random_tokens(4 * 64 + 1, 256, 3);
  ids[100] = (ids[100] + 1) % 256;
  write_token_file(dir_.file("r1/d.h5"), ids);
  r = per_rank_dirs(dir_, args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("'sample of the training data 1 d.h5' differs"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_.file("out/latest")));
}

// At 2fc8691: --resume with another same-shaped --data or --model was accepted silently.
TEST_F(Resilience, ResumeRefusesOtherInputsUnlessAllowed) {
  const std::string model = write_model("m.h5", "hydrahead-tiny", 1), data = write_tokens("d.h5", 4 * 64 + 1, 2);
  const std::string out = dir_.file("out");
  const std::string common = "train --stage pretrain --model " + model + " --data " + data +
                             " --seq-len 64 --steps 4 --device cpu --out-dir " + out;
  ASSERT_EQ(hydra(common + " --stop-at 2").exit_code, 0);
  write_tokens("d.h5", 4 * 64 + 1, 9);  // same length, other tokens
  expect_user_error(hydra(common + " --resume"), "training data 1 " + data + " (other contents");
  write_model("m.h5", "hydrahead-tiny", 7);
  expect_user_error(hydra(common + " --resume"), "model " + model + " (other contents");
  const CommandResult r = hydra(common + " --resume --allow-changed-inputs");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--allow-changed-inputs"), std::string::npos) << r.output;
}

// Data regenerated with the same command and seed is other bytes (HDF5
// stores object times) but the same contents: --resume continues without any flag. Other contents
// are refused, naming the file and the datasets that differ.
TEST_F(Resilience, RegeneratedDataResumesOtherDataIsNamed) {
  const std::string data = dir_.file("synth.h5"), out = dir_.file("out");
  const std::string synth = "synth --task lm:0.5,single:0.5 --tokens 2K --seq-len 64 --vocab 256 --loss answers --out " + data;
  ASSERT_EQ(hydra(synth + " --seed 3").exit_code, 0);
  const std::string common = "train --stage pretrain --preset qwen3-tiny --data " + data +
                             " --seq-len 64 --steps 4 --device cpu --out-dir " + out;
  ASSERT_EQ(hydra(common + " --stop-at 2").exit_code, 0);
  const uint64_t first_bytes = hash_file(data);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // HDF5's object times have 1 s resolution
  ASSERT_EQ(hydra(synth + " --seed 3").exit_code, 0);
  ASSERT_NE(hash_file(data), first_bytes) << "the regenerated file has the same bytes: the test shows nothing";
  CommandResult r = hydra(common + " --resume");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(hydra(synth + " --seed 4").exit_code, 0);
  r = hydra("train --stage pretrain --preset qwen3-tiny --data " + data + " --seq-len 64 --steps 6 --device cpu "
            "--out-dir " + out + " --resume");
  expect_user_error(r, "training data 1 " + data + " (other contents: input_ids, loss_mask, answer_start, answer_length differ");
}

// ---- Checked state -------------------------------------------------------------------------------

// Rewrites element 0 of `dataset` (f32) or the int64 attribute `attribute` of an HDF5 file in place.
void poke_dataset(const std::string& path, const std::string& dataset, float value) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  ASSERT_GE(d, 0);
  const hid_t space = H5Dget_space(d);
  std::vector<float> v(static_cast<size_t>(H5Sget_simple_extent_npoints(space)));
  H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  v[0] = value;
  H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  H5Sclose(space);
  H5Dclose(d);
  H5Fclose(f);
}
void poke_attribute(const std::string& path, const std::string& attribute, int64_t value) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hid_t a = H5Aopen(f, attribute.c_str(), H5P_DEFAULT);
  ASSERT_GE(a, 0);
  H5Awrite(a, H5T_NATIVE_INT64, &value);
  H5Aclose(a);
  H5Fclose(f);
}

// At 2fc8691: a finite overwrite trained on silently, NaNs gave "the loss is -nan … the last good
// checkpoint is <the damaged one>", a step of −3 was an internal error.
TEST_F(Resilience, DamagedStateIsAOneLineErrorNamingIt) {
  const std::string model = write_model("m.h5", "hydrahead-tiny", 1), data = write_tokens("d.h5", 4 * 64 + 1, 2);
  const std::string common = "train --stage pretrain --model " + model + " --data " + data +
                             " --seq-len 64 --steps 4 --device cpu --out-dir ";
  const std::string master = "master";
  struct Damage {
    std::string name, needle;
    std::function<void(const std::string&)> apply;
  };
  const std::vector<Damage> cases = {
      {"finite", "does not match its checksum", [&](const std::string& p) { poke_dataset(p, master, 0.25f); }},
      {"nan", "does not match its checksum", [&](const std::string& p) { poke_dataset(p, master, std::nanf("")); }},
      {"step", "the manifest names [0, ", [&](const std::string& p) { poke_attribute(p, "step", -3); }},
      {"ff", "shard-00000-of-00001.h5", [&](const std::string& p) {
         const auto size = fs::file_size(p);
         std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
         f.seekp(static_cast<std::streamoff>(size / 2));
         const std::string ff(static_cast<size_t>(size / 4), '\xff');
         f.write(ff.data(), static_cast<std::streamsize>(ff.size()));
       }}};
  for (const Damage& d : cases) {
    const std::string out = dir_.file("out-" + d.name), state = out + "/step-000002/shard-00000-of-00001.h5";
    ASSERT_EQ(hydra(common + out + " --stop-at 2").exit_code, 0);
    d.apply(state);
    const CommandResult r = hydra(common + out + " --resume");
    expect_user_error(r, state);
    EXPECT_NE(r.output.find(d.needle), std::string::npos) << d.name << "\n" << r.output;
  }
}

// ---- Flags and files -----------------------------------------------------------------------------

// At 2fc8691 each of these ran (exit 0) with a default in place of the number given, or a step at inf.
TEST_F(Resilience, InvalidNumbersAreOneLineErrors) {
  const std::string model = write_model("m.h5", "hydrahead-tiny", 1), data = write_tokens("d.h5", 4 * 64 + 1, 2);
  const std::string base = "train --stage pretrain --model " + model + " --data " + data +
                           " --seq-len 64 --steps 4 --device cpu --out-dir " + dir_.file("out");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--weight-decay -5", "--weight-decay"}, {"--weight-decay nan", "--weight-decay nan: not a finite number"},
      {"--min-lr -2", "--min-lr"},             {"--min-lr nan", "--min-lr nan: not a finite number"},
      {"--warmup -2", "--warmup -2"},          {"--lr inf", "--lr inf: not a finite number"},
      {"--lr 0", "--lr 0 must be above 0"},    {"--lr 1e-3 --min-lr 1e-2", "must lie in [0, --lr"},
      {"--warmup 9", "in [0, --steps 4]"},     {"--eval-every 2", "needs something to evaluate"},
      {"--batch-seqs 50", "a step would train on the same window twice"},
      {"--grad-clip nan", "--grad-clip"}};
  for (const auto& [flags, needle] : cases) {
    SCOPED_TRACE(flags);
    expect_user_error(hydra(base + " " + flags), needle);
  }
  EXPECT_FALSE(fs::exists(dir_.file("out/latest")));
}

// At 2fc8691: a file as --out-dir (or a path under one) was an internal error (exit 1); a fresh run
// appended to a leftover train.jsonl; a log that could not be written was ignored (exit 0).
TEST_F(Resilience, OutputFolderProblemsAreOneLineErrors) {
  const std::string model = write_model("m.h5", "hydrahead-tiny", 1), data = write_tokens("d.h5", 4 * 64 + 1, 2);
  const std::string base = "train --stage pretrain --model " + model + " --data " + data +
                           " --seq-len 64 --device cpu --out-dir ";
  const std::string file = dir_.file("a-file");
  std::ofstream(file) << "x";
  expect_user_error(hydra(base + file + " --steps 1"), "--out-dir " + file + " is a file");
  expect_user_error(hydra(base + file + "/sub --steps 1"), "is a file");
  expect_user_error(hydra(base + "/proc/hydra-out --steps 1"), "/proc/hydra-out");
  // A leftover log without a checkpoint (a run with --save-every -1).
  const std::string out = dir_.file("out");
  ASSERT_EQ(hydra(base + out + " --steps 2 --save-every -1").exit_code, 0);
  expect_user_error(hydra(base + out + " --steps 2"), "holds the train.jsonl of another run");
  EXPECT_EQ(losses(out).size(), 2u);
  // The log past a 4 KiB file-size limit (a full disk): the run fails instead of exiting 0. Open MPI's
  // shared-memory files obey the limit too: its dstore and shared-memory transport are switched off.
  const CommandResult r = run_command("env PMIX_MCA_gds=hash OMPI_MCA_btl=self bash -c \"trap '' XFSZ; ulimit -f 4; exec " +
                                      hydra_binary() + " " + base +
                                      dir_.file("full") + " --steps 40 --save-every -1\"");
  expect_user_error(r, "train.jsonl failed (disk full");
}

// At 2fc8691 every CPU run printed "memory plan 0.0 GiB" and "MFU 0.0%", and "eval_loss": -1.0
// without an evaluation; the distill eval figure was unlabelled.
TEST_F(Resilience, CpuOutputHasNoMeaninglessFigures) {
  const std::string model = write_model("m.h5", "hydrahead-tiny", 1), data = write_tokens("d.h5", 4 * 64 + 1, 2);
  const CommandResult r = hydra("train --stage pretrain --model " + model + " --data " + data +
                                " --seq-len 64 --steps 2 --device cpu --out-dir " + dir_.file("out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("MFU"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("memory plan"), std::string::npos) << r.output;
  const nlohmann::json s = nlohmann::json::parse(r.output.substr(r.output.rfind("{\"command\"")));
  EXPECT_TRUE(s.at("eval_loss").is_null()) << s.dump();
  EXPECT_TRUE(s.at("mfu").is_null()) << s.dump();
  const std::string teacher = write_model("t.h5", "qwen3-tiny", 2), student = write_model("s.h5", "qwen3-tiny", 3);
  const CommandResult d = hydra("train --stage distill --model " + student + " --teacher " + teacher + " --data " + data +
                                " --eval-data " + data + " --eval-windows 1 --seq-len 64 --steps 1 --device cpu --out-dir " +
                                dir_.file("distill"));
  ASSERT_EQ(d.exit_code, 0) << d.output;
  EXPECT_NE(d.output.find("eval kl "), std::string::npos) << d.output;
  EXPECT_EQ(nlohmann::json::parse(d.output.substr(d.output.rfind("{\"command\""))).at("eval_metric"), "kl");
}

// ---- Checkpoints written by every rank (model/train/shards.h) ------------------------------------

nlohmann::json manifest_of(const std::string& step_dir) {
  return nlohmann::json::parse(read_all((fs::path(step_dir) / "manifest.json").string()));
}

// Four ranks write their shards at once: no rank waits for another before writing its own. Rank 0
// (which names the folder and writes the manifest) is held half way through its shard
// (HYDRA_INJECT_FAULT=0:hold@save, runtime/fault.h) until the test has seen ranks 1–3 finish theirs
// in the step's temporary folder while rank 0's is still unfinished; then it is released and the
// save completes: 4 shards covering the state once, the saved line naming each rank's interval.
// Conditions, not clocks: the waits below end when the files appear (their limits only bound a
// failure), so the test passes with 4 ranks on 2 loaded cores. (It replaced a test that compared
// the ranks' wall-clock write intervals and failed 1 run in 11 there.)
TEST_F(Resilience, RanksWriteTheirShardsWhileRankZeroIsHeld) {
  const std::string model = write_model("m.h5", "hydrahead-tiny", 3), data = write_tokens("d.h5", 4 * 64 + 1, 4);
  const std::string out = dir_.file("out"), release = dir_.file("release"), log = dir_.file("train.log");
  const std::string status = dir_.file("status");
  // The job in the background (its shell detached from this one's output), its exit status in `status`.
  const std::string job = "HYDRA_INJECT_FAULT=0:hold@save HYDRA_FAULT_RELEASE=" + release + " timeout 300 " +
                          mpirun(4) + hydra_binary() + " train --stage pretrain --model " + model + " --data " + data +
                          " --seq-len 64 --steps 1 --device cpu --save-timeout 3600 --out-dir " + out;
  // --save-timeout 3600: ranks 1-3 wait for rank 0 as long as the test holds it, however loaded the
  // machine. On any exit of the test (a failed ASSERT included) rank 0 is released and the job awaited,
  // so nothing outlives the test's folder.
  struct Release {
    const std::string &release, &status;
    ~Release() {
      std::ofstream(release) << "go\n";
      for (int i = 0; i < 6000 && !fs::exists(status); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } release_on_exit{release, status};
  ASSERT_EQ(run_command("bash -c '(" + job + " > " + log + " 2>&1; echo $? > " + status + ") < /dev/null > /dev/null "
                        "2>&1 &'").exit_code, 0);
  // Until rank 0 is held and ranks 1–3 have committed their shards (or the job ended without that).
  const auto shards_in_temporary = [&] {
    std::vector<std::string> found;
    std::error_code ec;
    for (const auto& step : fs::directory_iterator(out, ec)) {
      if (step.path().filename().string().rfind(".step-000001.tmp-", 0) != 0) continue;
      for (const auto& f : fs::directory_iterator(step.path(), ec)) found.push_back(f.path().filename().string());
    }
    std::sort(found.begin(), found.end());
    return found;
  };
  const std::vector<std::string> others = {"shard-00001-of-00004.h5", "shard-00002-of-00004.h5", "shard-00003-of-00004.h5"};
  std::vector<std::string> seen;
  for (int i = 0; i < 6000 && !fs::exists(status); ++i) {  // at most 300 s: a failure's bound, never a pass's
    seen = shards_in_temporary();
    const bool all = std::all_of(others.begin(), others.end(),
                                 [&](const std::string& s) { return std::count(seen.begin(), seen.end(), s) == 1; });
    if (all && fs::exists(release + ".held")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(fs::exists(release + ".held")) << "rank 0 never reached its shard's write\n" << read_all(log);
  for (const std::string& s : others) {
    EXPECT_EQ(std::count(seen.begin(), seen.end(), s), 1) << s << " not written while rank 0 was held: " << fmt::format(
        "{}", fmt::join(seen, ", ")) << "\n" << read_all(log);
  }
  // Rank 0's own shard is unfinished: its temporary is there, the committed name is not.
  EXPECT_EQ(std::count(seen.begin(), seen.end(), "shard-00000-of-00004.h5"), 0) << fmt::format("{}", fmt::join(seen, ", "));
  EXPECT_FALSE(fs::exists(out + "/latest"));
  std::ofstream(release) << "go\n";
  for (int i = 0; i < 6000 && !fs::exists(status); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(fs::exists(status)) << "the job did not end after the release\n" << read_all(log);
  const std::string output = read_all(log);
  ASSERT_EQ(std::atoi(read_all(status).c_str()), 0) << output;
  const nlohmann::json m = manifest_of(out + "/step-000001");
  ASSERT_EQ(m.at("shards").size(), 4u) << m.dump(1);
  int64_t at = 0;
  for (const nlohmann::json& s : m.at("shards")) {
    EXPECT_EQ(s.at("begin").get<int64_t>(), at);
    at = s.at("end").get<int64_t>();
    EXPECT_TRUE(fs::exists(out + "/step-000001/" + s.at("file").get<std::string>()));
  }
  EXPECT_EQ(at, m.at("trainable").get<int64_t>());
  EXPECT_NE(output.find("shards written at s after the save began: rank 0 "), std::string::npos) << output;
  // model.h5 stays a plain checkpoint every command reads.
  EXPECT_EQ(run_command(hydra_binary() + " info --model " + out + "/step-000001/model.h5").exit_code, 0);
}

// A rank killed half way through writing its shard (kill -9, HYDRA_INJECT_FAULT=2:kill@save) ends
// the job within seconds; `latest` still names the previous step, which resumes: the run then ends
// with the uninterrupted run's losses, bit for bit, and no temporary folder is left.
TEST_F(Resilience, RankKilledMidSaveLeavesThePreviousStepLoadable) {
  const std::string model = write_model("m.h5", "hydrahead-tiny", 6), data = write_tokens("d.h5", 16 * 64 + 1, 7);
  const std::string common = " train --stage pretrain --model " + model + " --data " + data +
                             " --seq-len 64 --steps 6 --device cpu --seed 4 --out-dir ";
  const std::string whole = dir_.file("whole"), cut = dir_.file("cut");
  ASSERT_EQ(run_command("timeout 300 " + mpirun(4) + hydra_binary() + common + whole).exit_code, 0);
  ASSERT_EQ(run_command("timeout 300 " + mpirun(4) + hydra_binary() + common + cut + " --stop-at 2").exit_code, 0);
  const CommandResult killed = run_command("HYDRA_INJECT_FAULT=2:kill@save timeout 300 " + mpirun(4) + hydra_binary() +
                                           common + cut + " --resume --stop-at 4");
  EXPECT_NE(killed.exit_code, 0) << killed.output;
  EXPECT_NE(killed.exit_code, 124) << "a rank was left waiting\n" << killed.output;
  EXPECT_EQ(latest_of(cut), "step-000002") << killed.output;
  EXPECT_FALSE(fs::exists(cut + "/step-000004")) << killed.output;
  const CommandResult resumed = run_command("timeout 300 " + mpirun(4) + hydra_binary() + common + cut + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  // The unfinished step's temporary folder is gone: removed by rank 0 when mpirun's SIGTERM reached
  // it, or swept by the resumed run (its writer's PID gone).
  for (const auto& e : fs::directory_iterator(cut)) {
    EXPECT_EQ(e.path().filename().string().rfind(".step-", 0), std::string::npos) << "left behind: " << e.path() << "\n"
                                                                                  << resumed.output;
  }
  EXPECT_EQ(losses(cut), losses(whole));
}

// A full disk while the shard is written (a 4 MiB file-size limit; the shard is 6.5 MB): one line
// naming the step and the problem, exit 2, no temporary folder left, `latest` unchanged; the run
// then resumes from the previous step.
TEST_F(Resilience, FullDiskDuringASaveKeepsThePreviousCheckpoint) {
  const std::string model = write_model("m.h5", "hydrahead-tiny", 8), data = write_tokens("d.h5", 4 * 64 + 1, 9);
  const std::string base = "train --stage pretrain --model " + model + " --data " + data +
                           " --seq-len 64 --steps 3 --device cpu --out-dir ";
  const std::string out = dir_.file("out");
  ASSERT_EQ(hydra(base + out + " --stop-at 1").exit_code, 0);
  const CommandResult r = run_command("env PMIX_MCA_gds=hash OMPI_MCA_btl=self bash -c \"trap '' XFSZ; ulimit -f 4096; exec " +
                                      hydra_binary() + " " + base + out + " --resume\"");
  expect_user_error(r, "saving step 3 failed: ");
  EXPECT_NE(r.output.find("the previous checkpoint ('latest') is unchanged"), std::string::npos) << r.output;
  EXPECT_EQ(latest_of(out), "step-000001");
  for (const auto& e : fs::directory_iterator(out)) {
    EXPECT_EQ(e.path().filename().string().rfind(".step-", 0), std::string::npos) << "left behind: " << e.path();
  }
  ASSERT_EQ(hydra(base + out + " --resume").exit_code, 0);
  EXPECT_EQ(latest_of(out), "step-000003");
}

}  // namespace
}  // namespace hydra::test
