// hydra train as a user runs it (CPU, tiny models): each stage does its job, a resumed run is the
// uninterrupted run bit for bit, interrupted saves are cleaned up, bad input is a one-line error
// before any step, and sequence / data parallel runs under mpirun give the single-rank losses.
#include <cmath>
#include <filesystem>
#include <fstream>

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

class Train : public ::testing::Test {
 protected:
  std::string write_model(const std::string& preset, uint64_t seed) {
    const std::string path = dir_.file(preset + "-" + std::to_string(seed) + ".h5");
    const ModelConfig c = preset_config(preset);
    write_model_checkpoint(path, c, random_parameters(c, seed));
    return path;
  }
  std::string write_tokens(const std::string& name, int64_t n, uint64_t seed) {
    const std::string path = dir_.file(name);
    write_token_file(path, random_tokens(n, 256, seed));
    return path;
  }
  TempDir dir_;
};

// Stage "pretrain" from random weights memorises one 64-token window: the loss starts at the
// uniform guess, ln 256 = 5.55, and ends far below it (the model has 0.6M parameters for 64
// tokens). Both architectures: the teacher (softmax attention) and the hybrid (FA + GDN heads).
TEST_F(Train, PretrainMemorisesAWindow) {
  const std::string data = write_tokens("one.h5", 65, 1);
  for (const std::string preset : {"qwen3-tiny", "hydrahead-tiny"}) {
    const std::string out = dir_.file("pretrain-" + preset);
    const CommandResult r = hydra("train --stage pretrain --preset " + preset + " --data " + data +
                                  " --seq-len 64 --steps 60 --lr 3e-3 --device cpu --out-dir " + out);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<double> l = losses(out);
    ASSERT_EQ(l.size(), 60u);
    EXPECT_NEAR(l.front(), std::log(256.0), 0.5) << preset;
    EXPECT_LT(l.back(), 0.1) << preset << ": a single window must be memorised";
    std::printf("%s: loss %.4f -> %.4f in 60 steps\n", preset.c_str(), l.front(), l.back());
    // The checkpoint is a normal model file: the forward on the window gives the trained loss.
    ASSERT_TRUE(fs::exists(fs::path(out) / "step-000060" / "model.h5")) << r.output;
    const CommandResult f = hydra("forward --model " + out + "/step-000060/model.h5 --input " + data);
    ASSERT_EQ(f.exit_code, 0) << f.output;
  }
}

// A stream of packed documents without a loss mask (hydra synth --doc-length): the targets that
// cross a document boundary do not count, and the step divides by the count of those that do
// (found on an H200: a 128K step of 8K documents stopped at an internal check, 131056 counted vs
// 131072 expected, because the count was taken as every target when no loss_mask was present).
TEST_F(Train, PackedDocumentsWithoutAMaskCountOnlyTargetsInsideDocuments) {
  const std::string data = dir_.file("docs.h5");
  const CommandResult s = hydra("synth --task lm --tokens 4K --seq-len 64 --vocab 256 --doc-length 16..16 --seed 3 "
                                "--out " + data);
  ASSERT_EQ(s.exit_code, 0) << s.output;
  const std::string out = dir_.file("packed");
  const CommandResult r = hydra("train --stage pretrain --preset qwen3-tiny --data " + data +
                                " --seq-len 64 --batch-seqs 2 --steps 2 --device cpu --out-dir " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<nlohmann::json> steps = log_lines(out);
  ASSERT_EQ(steps.size(), 2u);
  for (const nlohmann::json& line : steps) {
    // 2 windows of 64 targets, 4 documents of 16 each: the 3 crossings inside a window and the
    // window's last target (which starts the next document) do not count: 2 × 60.
    EXPECT_EQ(line["counted_tokens"].get<int64_t>(), 120) << line.dump();
  }
}

// Stage "align": only the attention block moves (the MLP, norms outside it and the embeddings stay
// bit-identical), and every layer's MSE to the teacher goes down.
TEST_F(Train, AlignTrainsOnlyTheAttentionBlockAndLowersEachLayersError) {
  const std::string teacher = write_model("qwen3-tiny", 3), student = dir_.file("student.h5");
  ASSERT_EQ(hydra("convert --teacher " + teacher + " --fa-heads uniform:1 --out " + student).exit_code, 0);
  const std::string data = write_tokens("align.h5", 8 * 64 + 1, 4), out = dir_.file("align");
  const CommandResult r = hydra("train --stage align --model " + student + " --teacher " + teacher + " --data " + data +
                                " --seq-len 64 --steps 30 --device cpu --out-dir " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<nlohmann::json> lines = log_lines(out);
  ASSERT_EQ(lines.size(), 30u);
  const auto first = lines.front().at("layer_loss").get<std::vector<double>>();
  const auto last = lines.back().at("layer_loss").get<std::vector<double>>();
  ASSERT_EQ(first.size(), 2u);
  for (size_t l = 0; l < first.size(); ++l) {
    EXPECT_LT(last[l], 0.5 * first[l]) << "layer " << l << " MSE " << first[l] << " -> " << last[l];
    std::printf("align layer %zu: MSE %.5f -> %.5f\n", l, first[l], last[l]);
  }
  const NamedTensors before = read_model_checkpoint(student).params, after = read_model_checkpoint(out + "/step-000030/model.h5").params;
  int moved = 0;
  for (const auto& [name, t] : before) {
    const bool attention = name.find(".mlp.") == std::string::npos && name.find("post_attention_layernorm") == std::string::npos &&
                           name.find("embed_tokens") == std::string::npos && name.find("lm_head") == std::string::npos &&
                           name != "model.norm.weight";
    const double change = max_rel_error(after.at(name), t);
    if (attention) {
      moved += change > 0;
    } else {
      EXPECT_EQ(change, 0.0) << name << " is outside the attention block and must not change";
    }
  }
  EXPECT_GT(moved, 10) << "attention-block tensors that changed";
}

// Stage "distill": the student (converted from the teacher) moves towards the teacher's
// distribution: the KL on the same windows goes down.
TEST_F(Train, DistillLowersTheKl) {
  const std::string teacher = write_model("qwen3-tiny", 5), student = dir_.file("student.h5");
  ASSERT_EQ(hydra("convert --teacher " + teacher + " --fa-heads uniform:1 --out " + student).exit_code, 0);
  const std::string data = write_tokens("distill.h5", 4 * 64 + 1, 6), out = dir_.file("distill");
  const CommandResult r = hydra("train --stage distill --model " + student + " --teacher " + teacher + " --data " + data +
                                " --seq-len 64 --steps 40 --lr 1e-3 --device cpu --out-dir " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> l = losses(out);
  ASSERT_EQ(l.size(), 40u);
  EXPECT_GT(l.front(), 0.0);
  const double tail = (l[36] + l[37] + l[38] + l[39]) / 4, head = (l[0] + l[1] + l[2] + l[3]) / 4;
  EXPECT_LT(tail, 0.5 * head) << "KL " << head << " -> " << tail;
  std::printf("distill: KL %.5f -> %.5f\n", head, tail);
}

// Stopping at step k (--stop-at, as a time limit would) and resuming gives the uninterrupted run
// exactly: the same losses and the same final weights, bit for bit (CPU path). A save killed half
// way (its temporary directory left behind) is removed by the resuming run.
TEST_F(Train, StopAndResumeIsBitIdentical) {
  const std::string model = write_model("hydrahead-tiny", 7), data = write_tokens("data.h5", 10 * 64 + 1, 8);
  const std::string eval = write_tokens("eval.h5", 2 * 64 + 1, 9);
  const std::string common = " --stage pretrain --model " + model + " --data " + data + " --eval-data " + eval +
                             " --seq-len 64 --steps 8 --batch-seqs 2 --grad-accum 2 --device cpu --seed 3";
  const std::string whole = dir_.file("whole"), split = dir_.file("split");
  ASSERT_EQ(hydra("train" + common + " --out-dir " + whole).exit_code, 0);
  const CommandResult a = hydra("train" + common + " --stop-at 3 --out-dir " + split);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(losses(split).size(), 3u);
  // What a kill -9 during a save leaves (PID 4999999 is above Linux's largest, so never alive).
  fs::create_directories(fs::path(split) / ".step-000004.tmp-4999999");
  std::ofstream(fs::path(split) / ".step-000004.tmp-4999999" / "model.h5") << "partial";
  const CommandResult b = hydra("train" + common + " --resume --out-dir " + split);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_FALSE(fs::exists(fs::path(split) / ".step-000004.tmp-4999999"));
  const std::vector<double> lw = losses(whole), ls = losses(split);
  ASSERT_EQ(lw.size(), 8u);
  ASSERT_EQ(ls.size(), 8u);
  for (size_t i = 0; i < lw.size(); ++i) EXPECT_EQ(lw[i], ls[i]) << "step " << i + 1;
  EXPECT_EQ(log_lines(whole, "eval").back().at("eval_loss"), log_lines(split, "eval").back().at("eval_loss"));
  const NamedTensors w = read_model_checkpoint(whole + "/step-000008/model.h5").params;
  const NamedTensors s = read_model_checkpoint(split + "/step-000008/model.h5").params;
  for (const auto& [name, t] : w) EXPECT_EQ(max_rel_error(s.at(name), t), 0.0) << name;
  // Saved at the stop and at the end (keep = 2 keeps both); `latest` names the newest.
  std::ifstream latest(fs::path(split) / "latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step-000008");
  EXPECT_TRUE(fs::exists(fs::path(split) / "step-000003") && fs::exists(fs::path(split) / "step-000008"));
}

// kill -9 half way through a save: the previous checkpoint stays loadable and `latest` keeps naming
// it; --resume continues from it, removes the partial save and ends where an uninterrupted run ends.
TEST_F(Train, KillDuringSaveLosesNothing) {
  const std::string model = write_model("qwen3-tiny", 13), data = write_tokens("data.h5", 6 * 64 + 1, 14);
  const std::string common = " --stage pretrain --model " + model + " --data " + data +
                             " --seq-len 64 --steps 4 --save-every 2 --device cpu --out-dir ";
  const std::string whole = dir_.file("whole"), killed = dir_.file("killed");
  ASSERT_EQ(hydra("train" + common + whole).exit_code, 0);
  ASSERT_EQ(hydra("train" + common + killed + " --stop-at 2").exit_code, 0);
  const CommandResult k = run_command("HYDRA_INJECT_FAULT=0:kill@save " + hydra_binary() + " train" + common + killed + " --resume");
  EXPECT_NE(k.exit_code, 0) << k.output;
  std::ifstream latest(fs::path(killed) / "latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step-000002") << "the pointer must still name the last complete checkpoint";
  int partial = 0;
  for (const auto& e : fs::directory_iterator(killed)) partial += e.path().filename().string().find(".tmp-") != std::string::npos;
  EXPECT_EQ(partial, 1) << "the killed save leaves its temporary directory";
  const CommandResult f = hydra("forward --model " + killed + "/step-000002/model.h5 --input " + data);
  EXPECT_EQ(f.exit_code, 0) << f.output;
  const CommandResult r = hydra("train" + common + killed + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(losses(killed), losses(whole));
  const NamedTensors w = read_model_checkpoint(whole + "/step-000004/model.h5").params;
  const NamedTensors s = read_model_checkpoint(killed + "/step-000004/model.h5").params;
  for (const auto& [n, t] : w) EXPECT_EQ(max_rel_error(s.at(n), t), 0.0) << n;
}

TEST_F(Train, BadInputIsAOneLineErrorBeforeAnyStep) {
  const std::string model = write_model("hydrahead-tiny", 1), teacher = write_model("qwen3-tiny", 1);
  const std::string data = write_tokens("d.h5", 100, 1), out = dir_.file("o");
  const std::string base = "train --model " + model + " --data " + data + " --device cpu --steps 2 --out-dir " + out;
  expect_user_error(hydra(base + " --stage pretrain --seq-len 128"), "shorter than one window");
  expect_user_error(hydra(base + " --stage warmup --seq-len 64"), "is not a stage");
  expect_user_error(hydra(base + " --stage align --seq-len 64"), "needs --teacher");
  expect_user_error(hydra(base + " --stage pretrain --seq-len 64 --teacher " + teacher), "takes no --teacher");
  expect_user_error(hydra(base + " --stage pretrain --seq-len 64 --resume"), "no checkpoint");
  expect_user_error(hydra(base + " --stage pretrain --seq-len 64 --sp 3"), "--sp 3 must divide");
  expect_user_error(hydra(base + " --stage pretrain --seq-len 64 --kept-activations most"), "--kept-activations must be");
  expect_user_error(hydra(base + " --stage pretrain --seq-len 64 --cuda-graph yes"), "--cuda-graph must be on, off or auto");
  expect_user_error(hydra(base + " --stage pretrain --seq-len 64 --cuda-graph on"), "it needs --device cuda");
  expect_user_error(hydra(base + " --stage pretrain --seq-len 64 --cuda-graph"), "it needs --device cuda");  // the flag alone: on
  const std::string big = dir_.file("big.h5");
  write_token_file(big, {1, 2, 300, 4});
  expect_user_error(hydra("train --stage pretrain --model " + model + " --data " + big +
                          " --seq-len 2 --steps 1 --device cpu --out-dir " + out), "300");
  EXPECT_FALSE(fs::exists(fs::path(out) / "latest"));
  // A finished run's directory is not overwritten by accident.
  ASSERT_EQ(hydra(base + " --stage pretrain --seq-len 64").exit_code, 0);
  expect_user_error(hydra(base + " --stage pretrain --seq-len 64"), "already holds a training run");
  expect_user_error(hydra("train --model " + model + " --data " + data + " --device cpu --steps 9 --out-dir " + out +
                          " --stage finetune --seq-len 64 --resume"),
                    "was saved by stage pretrain");
}

// Under mpirun: one sequence over 2 or 4 ranks (--sp = world), 2 data-parallel replicas of one
// rank (--sp 1 on 2 ranks) and 2 replicas of 2 ranks (--sp 2 on 4 ranks) give the losses and the
// final weights of one rank with the same windows per step (batch 2), to fp32 summation order.
TEST_F(Train, SequenceAndDataParallelRunsMatchOneRank) {
  const std::string model = write_model("hydrahead-tiny", 11), data = write_tokens("data.h5", 8 * 64 + 1, 12);
  const std::string common = "train --stage pretrain --model " + model + " --data " + data +
                             " --seq-len 64 --steps 4 --device cpu --seed 5";
  const std::string one = dir_.file("one");
  ASSERT_EQ(hydra(common + " --batch-seqs 2 --out-dir " + one).exit_code, 0);
  const std::vector<double> l1 = losses(one);
  ASSERT_EQ(l1.size(), 4u);
  const NamedTensors w1 = read_model_checkpoint(one + "/step-000004/model.h5").params;
  struct Layout {
    int ranks;
    std::string flags, name;
  };
  for (const Layout& run : {Layout{2, "--batch-seqs 2 --sp 2", "sp2"}, Layout{2, "--sp 1", "dp2"},
                            Layout{4, "--batch-seqs 2 --sp 4", "sp4"}, Layout{4, "--sp 2", "dp2xsp2"}}) {
    const std::string out = dir_.file(run.name);
    const CommandResult r = run_command(mpirun(run.ranks) + " " + hydra_binary() + " " + common + " " + run.flags +
                                        " --out-dir " + out);
    ASSERT_EQ(r.exit_code, 0) << run.name << "\n" << r.output;
    const std::vector<double> l = losses(out);
    ASSERT_EQ(l.size(), 4u) << run.name;
    for (size_t i = 0; i < l1.size(); ++i) EXPECT_NEAR(l[i], l1[i], 1e-5 * l1[i]) << run.name << ", step " << i + 1;
    // Weights to 1e-3 of each tensor's largest value: AdamW turns a gradient element near zero into
    // an update of ±lr whatever its rounding, so fp32 summation order alone moves weights by up to
    // 3.4e-4 here; a missing rank's gradient changes most updates of a tensor, by up to 2·lr each.
    const NamedTensors w = read_model_checkpoint(out + "/step-000004/model.h5").params;
    for (const auto& [name, t] : w1) EXPECT_LT(max_rel_error(w.at(name), t), 1e-3) << run.name << ": " << name;
  }
}

// ZeRO-1 through the command: on 4 ranks, --zero 1 (the default there) and --zero 0 give
// the same 20 losses and final weights to 1e-6 relative, as one sequence group and as 2 replicas
// of --sp 2 (both forms add the ranks' gradients in one order: tests/parallel/zero_parallel_test.cpp).
// A bad value is refused before any work.
TEST_F(Train, ShardedOptimizerMatchesReplicated) {
  const std::string model = write_model("hydrahead-tiny", 13), data = write_tokens("data.h5", 48 * 64 + 1, 14);
  const std::string common = "train --stage pretrain --model " + model + " --data " + data +
                             " --seq-len 64 --steps 20 --device cpu --seed 3 --batch-seqs 2";
  for (const std::string sp : {"4", "2"}) {
    std::vector<double> l[2];
    NamedTensors w[2];
    for (int zero : {0, 1}) {
      const std::string out = dir_.file("zero" + std::to_string(zero) + "-sp" + sp);
      const std::string flag = zero == 0 ? " --zero 0" : "";  // 1 is the default on 4 ranks
      const CommandResult r = run_command(mpirun(4) + " " + hydra_binary() + " " + common + " --sp " + sp + flag +
                                          " --out-dir " + out);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      l[zero] = losses(out);
      ASSERT_EQ(l[zero].size(), 20u);
      w[zero] = read_model_checkpoint(out + "/step-000020/model.h5").params;
    }
    for (size_t i = 0; i < l[0].size(); ++i) EXPECT_NEAR(l[1][i], l[0][i], 1e-6 * l[0][i]) << "--sp " << sp << ", step " << i + 1;
    for (const auto& [name, t] : w[0]) EXPECT_LT(norm_rel_error(w[1].at(name), t), 1e-6) << "--sp " << sp << ": " << name;
  }
  expect_user_error(hydra(common + " --zero 2 --out-dir " + dir_.file("bad")), "--zero must be 0, 1 or auto");
}

// Resume on another world size: a 4-rank run stopped after step 3 continues on 2 ranks
// (--sp 2) and on 1 rank with the same 2 windows per step, and steps 4..6 give the uninterrupted
// 4-rank run's losses to fp32 summation order (4 shards re-cut on load: each rank reads the shards
// its range overlaps; tests/parallel/checkpoint_parallel_test.cpp holds the float64 form to 1e-10). A resume whose step takes another number of windows is refused with both counts.
TEST_F(Train, ResumeOnAnotherWorldSize) {
  const std::string model = write_model("hydrahead-tiny", 15), data = write_tokens("data.h5", 16 * 64 + 1, 16);
  const std::string common = "train --stage pretrain --model " + model + " --data " + data +
                             " --seq-len 64 --steps 6 --device cpu --seed 7 --batch-seqs 2";
  const std::string whole = dir_.file("whole"), cut = dir_.file("cut");
  ASSERT_EQ(run_command(mpirun(4) + " " + hydra_binary() + " " + common + " --out-dir " + whole).exit_code, 0);
  const std::vector<double> expected = losses(whole);
  ASSERT_EQ(expected.size(), 6u);
  const CommandResult first = run_command(mpirun(4) + " " + hydra_binary() + " " + common + " --stop-at 3 --out-dir " + cut);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  struct Continuation {
    int ranks;
    std::string flags, name;
  };
  for (const Continuation& c : {Continuation{2, "--sp 2", "on2"}, Continuation{1, "", "on1"}}) {
    const std::string out = dir_.file(c.name);
    fs::copy(cut, out, fs::copy_options::recursive);
    const std::string launch = c.ranks > 1 ? mpirun(c.ranks) + " " : "";
    const CommandResult r = run_command(launch + hydra_binary() + " " + common + " " + c.flags + " --resume --out-dir " + out);
    ASSERT_EQ(r.exit_code, 0) << c.name << "\n" << r.output;
    const std::vector<double> l = losses(out);
    ASSERT_EQ(l.size(), 6u) << c.name;
    for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(l[i], expected[i], 1e-5 * expected[i]) << c.name << ", step " << i + 1;
  }
  // 2 ranks as 2 replicas of one (--sp 1): 4 windows a step, not 2.
  const std::string refused = dir_.file("refused");
  fs::copy(cut, refused, fs::copy_options::recursive);
  const CommandResult r =
      run_command(mpirun(2) + " " + hydra_binary() + " " + common + " --sp 1 --resume --out-dir " + refused);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("was saved with 2 windows per step"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("this run takes 4"), std::string::npos) << r.output;
}

// A rank that fails in the middle of a step (an exception in its backward, or dying without a
// word) ends every rank within seconds, with the message, and no checkpoint is written.
TEST_F(Train, RankFailingMidStepEndsTheJob) {
  const std::string model = write_model("hydrahead-tiny", 3), data = write_tokens("data.h5", 4 * 64 + 1, 4);
  for (const std::string fault : {"1:backward", "1:crash"}) {
    const std::string out = dir_.file("failed-" + fault.substr(2));
    const CommandResult r = run_command("HYDRA_INJECT_FAULT=" + fault + " timeout 120 " + mpirun(2) + " " +
                                        hydra_binary() + " train --stage pretrain --model " + model + " --data " +
                                        data + " --seq-len 64 --steps 2 --sp 2 --device cpu --out-dir " + out);
    EXPECT_NE(r.exit_code, 0) << fault << "\n" << r.output;
    EXPECT_NE(r.exit_code, 124) << fault << ": timed out, a rank was left waiting\n" << r.output;
    EXPECT_LT(r.seconds, 30.0) << fault << "\n" << r.output;
    if (fault == "1:backward") {
      EXPECT_NE(r.output.find("(rank 1): injected fault at 'backward'"), std::string::npos) << r.output;
    }
    EXPECT_FALSE(fs::exists(fs::path(out) / "latest")) << fault;
  }
}

}  // namespace
}  // namespace hydra::test
