// hydra eval-lm: held-out language-model loss — the mean next-token cross-entropy over the first N
// windows of token files, cut exactly as `hydra train --eval-data` cuts them (model/train/data.h:
// seq_len + 1 tokens, stride seq_len) and computed by the trainer's own evaluation
// (model/train/evaluation.h held_out_loss, the pretrain stage's objective), so a model's figure here
// equals its training run's evaluation loss on the same files and length. The world is cut into
// sequence groups of --sp ranks (parallel/sequence_groups.h; 0: one group of all ranks); window i
// runs on group i mod groups, spread over its ranks (zigzag layout), as training's replicas share
// the held-out windows; the token-weighted sums are reduced across all ranks. Rank 0 prints the
// summary line and a JSON line, and writes --out when given.
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "launch/cli.h"
#include "launch/model_source.h"
#include "model/sequence_length.h"
#include "model/train/data.h"
#include "model/train/evaluation.h"
#include "parallel/device_world.h"
#include "parallel/sequence_groups.h"
#include "runtime/atomic_file.h"
#include "runtime/log.h"
#include "runtime/sizes.h"
#include "runtime/token_file.h"

namespace hydra {
namespace {

struct EvalLmOptions {
  ModelSource model;
  std::string data, seq_len, out, device = "auto";
  int64_t windows = 16;
  double nccl_timeout = 600;
  int sp = 0;

  void bind(po::options_description& o) {
    model.bind(o);
    o.add_options()
        ("data", po::value(&data)->required(), "held-out corpora, comma-separated: token files (.h5 with input_ids [N]) or folders of shards from cluster/tokenize_text.py (the folder or its manifest.json); CORPUS:W weighs a blend, as hydra train --eval-data")
        ("seq-len", po::value(&seq_len)->required(), "tokens per window (accepts 4K); a multiple of 2·sp under mpirun")
        ("windows", po::value(&windows)->default_value(16), "windows evaluated: the first N in file order (0: all)")
        ("out", po::value(&out), "also write the JSON summary to this file (rank 0, atomically)")
        ("sp", po::value(&sp)->default_value(0), "ranks per window (sequence parallel): world / sp groups evaluate different windows side by side (0: all ranks on every window)")
        ("device", po::value(&device)->default_value("auto"), "cuda, cpu or auto (cuda when a GPU is present)")
        ("nccl-timeout", po::value(&nccl_timeout)->default_value(600), "seconds before a stuck NCCL operation ends the job");
  }
  std::vector<train::DataSource> sources() const { return train::parse_data_sources(data, "--data"); }
  std::vector<std::string> files() const {
    std::vector<std::string> out_files;
    for (const train::DataSource& s : sources()) out_files.push_back(s.path);
    return out_files;
  }
  void validate() const {
    model.validate();
    HYDRA_USER_CHECK(!files().empty(), "--data names no file");
    for (const std::string& f : files()) require_readable_file(f, "held-out data");
    HYDRA_USER_CHECK(parse_size(seq_len, "--seq-len") >= 1, "--seq-len must be at least 1");
    HYDRA_USER_CHECK(windows >= 0, "--windows must not be negative (0: all)");
    if (!out.empty()) require_writable_destination(out, "summary");
    std::vector<std::string> inputs = files();
    inputs.push_back(model.model_path);
    if (!out.empty()) require_not_an_input(out, inputs, "--out");
  }
};

}  // namespace

int run_eval_lm(App& app, const std::vector<std::string>& args) {
  EvalLmOptions opt;
  po::options_description desc("hydra eval-lm");
  opt.bind(desc);
  if (!parse_command_line(app, "eval-lm",
                          "(--model FILE.h5 | --preset NAME) --data CORPUS[:W][,MORE] --seq-len N [--windows N] [--sp N] [--out FILE.json]",
                          desc, args)) {
    return 0;
  }
  opt.validate();
  const int64_t seq_len = parse_size(opt.seq_len, "--seq-len");
  ModelRun job = ModelRun::begin(app, opt.model, opt.device);  // config, device, the inputs' fingerprint
  const ModelConfig& config = job.config;
  const int sp = SequenceGroups::resolve_sp(opt.sp, app.world.size());
  check_sequence_length(config, seq_len, sp);
  const train::TokenWindows data(opt.sources(), seq_len, 0, config.vocab_size, false);  // as train's --eval-data
  const int64_t n = opt.windows == 0 ? data.count() : std::min(opt.windows, data.count());
  RunFingerprint& inputs = job.inputs;
  for (const std::string& f : opt.files()) add_file_datasets(inputs, "held-out data", f);  // masks and documents too
  inputs.add("windows", std::to_string(n));
  ModelRun::Started ready = job.start(app, opt.model, opt.device, opt.nccl_timeout);
  DeviceWorld& world = ready.world;
  const Model& model = ready.model;
  Communicator& comm = *world.comm;
  SequenceGroups groups(comm, sp);
  const auto t0 = std::chrono::steady_clock::now();
  // Window i on group i mod groups, one window at a time over the group's ranks.
  const train::StageRun run{.stage = train::Stage::pretrain, .sequence = groups.sequence(), .student = model, .teacher = nullptr};
  const train::LossSums total = train::held_out_loss(
      run, comm, data, {.windows = n, .batch_seqs = 1, .replica = groups.replica(), .replicas = groups.replicas()});
  check_device_progress(world);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t tokens = total.tokens, answer_tokens = total.answer_tokens;
  if (app.world.rank() == 0) {
    if (tokens == 0) {
      log::warn("eval-lm: the loss_mask counts no target of these {} windows: no loss to report", n);
    } else {
      log::info("eval-lm: {} windows of {} tokens ({} targets counted), mean next-token loss {:.4f} nats{} ({:.1f} s)", n,
                seq_len, tokens, train::mean_loss(total),
                answer_tokens > 0 ? fmt::format(", retrieval answers {:.4f} over {} targets",
                                                total.answer_loss / static_cast<double>(answer_tokens), answer_tokens)
                                  : "",
                seconds);
    }
    // null where nothing was counted (a mask that counts no target of these windows)
    nlohmann::json summary = {{"command", "eval-lm"}, {"model", opt.model.describe()}, {"data", opt.data},
                              {"seq_len", seq_len},    {"windows", n},  {"tokens", tokens},
                              {"loss", tokens > 0 ? nlohmann::json(train::mean_loss(total)) : nlohmann::json()},
                              {"device", device_flag_name(world.device)},
                              {"ranks", comm.size()},  {"sp", sp}, {"seconds", seconds}};
    summary.update(train::loss_fields(total, ""));  // answer_loss, answer_tokens, other_loss, counted_tokens
    std::cout << summary.dump() << std::endl;
    if (!opt.out.empty()) {
      AtomicFile file(opt.out);
      std::ofstream(file.temp_path()) << summary.dump() << "\n";
      file.commit();
    }
  }
  return 0;
}

}  // namespace hydra
