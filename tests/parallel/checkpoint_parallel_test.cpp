// Checkpoints written by every rank and re-cut on load (model/train/shards.h), in float64 so that
// "the same run" means 1e-10, not fp32 rounding. Under mpirun with P ranks: a run of 6 steps on P
// ranks (as 2 replicas of P/2 for even P, else one sequence group) is the reference; the same run
// stopped after step 3 writes P shards, and every divisor q of P continues it on q ranks (one
// sequence group of q, the same 2 windows a step; the world split into P/q groups, each resuming
// its own copy): steps 4..6 must give the reference losses to 1e-10 relative. The same checkpoint
// rewritten in the older single-file form (state.h5 by checkpoint names) resumes too.
#include <cmath>
#include <filesystem>

#include "model/model.h"
#include "model/params.h"
#include "model/train/shards.h"
#include "model/train/state.h"
#include "model/train/trainer.h"
#include "runtime/content_hash.h"
#include "runtime/hdf5_file.h"
#include "runtime/token_file.h"
#include "tests/common/test_util.h"
#include "tests/launch/train_log.h"
#include "tests/parallel/parallel_test_util.h"

namespace hydra::test {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kSeqLen = 48;  // a multiple of 2·sp for sp = 1..4
constexpr int64_t kWindowsPerStep = 2;

struct Run {
  std::string data, out;
  int sp = 1;
  int64_t batch_seqs = 1, stop_at = 0;
  bool resume = false;
};

// Trains the hydrahead-tiny model in float64 on `comm` (its own world) as `run` says.
void train(Communicator& comm, const Run& run) {
  const ModelConfig config = preset_config("hydrahead-tiny");
  Model student(config, random_parameters(config, 71), Device::host, DType::f64);
  train::TrainConfig c;
  c.stage = train::Stage::pretrain;
  c.data = {run.data};
  c.seq_len = kSeqLen;
  c.steps = 6;
  c.stop_at = run.stop_at;
  c.batch_seqs = run.batch_seqs;
  c.seed = 5;
  c.out_dir = run.out;
  c.resume = run.resume;
  c.sp = run.sp;
  c.optim.lr = 3e-3;
  c.optim.grad_clip = 1.5;
  SequenceGroups topology(comm, run.sp);
  train::run_training(c, topology, student, nullptr);
}

// The older single-file form of step folder `dir` in `old_dir`: model.h5 and state.h5 (every
// optimizer tensor by checkpoint name, with its XXH3, and the run's attributes), as hydra wrote
// before shards. Collective over `comm`.
void write_old_form(Communicator& comm, const std::string& dir, const std::string& old_dir) {
  const ModelConfig config = preset_config("hydrahead-tiny");
  Model model(config, random_parameters(config, 71), Device::host, DType::f64);
  train::AdamW optimizer(model, {}, [](const std::string&) { return true; }, &comm, train::Zero::sharded);
  train::load_sharded_state(dir, optimizer);
  const NamedTensors state = optimizer.state(comm.rank() == 0), masters = optimizer.master_parameters(comm.rank() == 0);
  if (comm.rank() != 0) return;
  const train::SavedRun run = train::read_manifest(dir);
  fs::create_directories(old_dir);
  write_model_checkpoint(old_dir + "/model.h5", config, masters);
  H5File h5 = H5File::create(old_dir + "/state.h5");
  nlohmann::json checksums = nlohmann::json::object();
  for (const auto& [name, t] : state) {
    const Tensor f32 = to(t, Device::host, DType::f32);  // the older form held f32 only
    h5.write(name, f32);
    checksums[name] = hash_hex(hash_tensor(f32));
  }
  const std::string text = checksums.dump();
  h5.write_uint8("checksums", {reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  h5.set_attribute("inputs", run.inputs.dump());
  h5.set_attribute("format", std::string("hydrahead-train-state"));
  h5.set_attribute("format_version", int64_t{2});
  h5.set_attribute("stage", run.stage);
  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"step", run.step}, {"data_position", run.position},
                                   {"seed", run.seed}, {"seq_len", run.seq_len}, {"world_size", run.world},
                                   {"sp", run.sp}, {"batch_seqs", run.batch_seqs}, {"grad_accum", run.grad_accum},
                                   {"replicas", run.replicas}}) {
    h5.set_attribute(key, value);
  }
  h5.set_attribute("data_state", run.data_state);
  h5.set_attribute("config", run.config);
  h5.close();
}

TEST(Checkpoint, ShardsResumeOnEveryDivisorOfTheWorld) {
  MpiCommunicator& comm = world();
  const int p = comm.size();
  // One folder for every rank: rank 0's, named to the others.
  std::optional<TempDir> owned;
  if (comm.rank() == 0) owned.emplace();
  const std::string root = comm.broadcast_text(owned ? owned->path().string() : "", 60, "test folder");
  const std::string data = root + "/data.h5";
  if (comm.rank() == 0) write_token_file(data, random_tokens(40 * kSeqLen + 1, 256, 9));
  comm.barrier();
  const int sp = p % 2 == 0 ? p / 2 : p;
  const int64_t batch = kWindowsPerStep * sp / p;  // windows a step = batch × replicas = 2
  train(comm, {.data = data, .out = root + "/whole", .sp = sp, .batch_seqs = batch});
  train(comm, {.data = data, .out = root + "/cut", .sp = sp, .batch_seqs = batch, .stop_at = 3});
  const std::vector<double> expected = losses(root + "/whole");
  ASSERT_EQ(expected.size(), 6u);
  {  // p shards, their ranges covering the state once (read_manifest checks it), and the run's identity
    const train::SavedRun saved = train::read_manifest(root + "/cut/step-000003");
    EXPECT_EQ(saved.world, p);
    EXPECT_EQ(saved.step, 3);
    EXPECT_EQ(saved.position, 3 * kWindowsPerStep);
  }
  const auto expect_continues = [&](const std::string& out, const std::string& what) {
    const std::vector<double> l = losses(out);
    ASSERT_EQ(l.size(), 6u) << what;
    double worst = 0;
    for (size_t i = 0; i < 6; ++i) {
      worst = std::max(worst, std::abs(l[i] - expected[i]) / expected[i]);
      EXPECT_NEAR(l[i], expected[i], 1e-10 * expected[i]) << what << ", step " << i + 1;
    }
    std::printf("%s: worst relative loss difference %.3g\n", what.c_str(), worst);
  };
  for (int q = p; q >= 1; --q) {
    if (p % q != 0) continue;
    std::unique_ptr<Communicator> group = comm.split(comm.rank() / q, comm.rank());
    const std::string out = fmt::format("{}/on{}-group{}", root, q, comm.rank() / q);
    if (group->rank() == 0) fs::copy(root + "/cut", out, fs::copy_options::recursive);
    group->barrier();
    train(*group, {.data = data, .out = out, .sp = q, .batch_seqs = kWindowsPerStep, .resume = true});
    if (group->rank() == 0) expect_continues(out, fmt::format("{} shards resumed on {} rank(s)", p, q));
    comm.barrier();
  }
  // The older single-file form of the same step resumes on the whole world.
  const std::string old = root + "/old";
  write_old_form(comm, root + "/cut/step-000003", old + "/step-000003");
  if (comm.rank() == 0) {
    fs::copy_file(root + "/cut/train.jsonl", old + "/train.jsonl");
    std::ofstream(old + "/latest") << "step-000003\n";
  }
  comm.barrier();
  train(comm, {.data = data, .out = old, .sp = sp, .batch_seqs = batch, .resume = true});
  // state.h5 held f32 (the older form's type): the continuation is the run's to fp32 rounding.
  if (comm.rank() == 0) {
    const std::vector<double> l = losses(old);
    ASSERT_EQ(l.size(), 6u);
    for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(l[i], expected[i], 1e-6 * expected[i]) << "older form, step " << i + 1;
  }
  comm.barrier();
}

}  // namespace
}  // namespace hydra::test
