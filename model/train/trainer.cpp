#include "model/train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "model/cost.h"
#include "model/eval/niah.h"
#include "model/params.h"
#include "model/train/data.h"
#include "model/train/objective.h"
#include "model/weight_layout.h"
#include "runtime/atomic_file.h"
#include "runtime/content_hash.h"
#include "runtime/fault.h"
#include "runtime/hdf5_file.h"
#include "runtime/host_memory.h"
#include "runtime/log.h"
#include "runtime/phase_timer.h"
#include "runtime/stop_request.h"
#if HYDRA_CUDA
#include "runtime/cuda_memory.h"
#endif

namespace hydra::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kStateFormat = "hydrahead-train-state";
// The seed of the NIAH samples scored during training (--eval-niah): fixed, so every evaluation of
// a run (and of every run) scores the same samples; eval-niah's default seed differs, and synth's
// training documents use a seed derived from their own (model/train/synth.h), so neither repeats them.
constexpr uint64_t kNiahEvalSeed = 7919;
// Version 2 added the per-dataset checksums and the inputs' fingerprints; a version-1 state still
// resumes, unverified (with a warning).
constexpr int64_t kStateVersion = 2;
constexpr const char* kChecksums = "checksums";  // the dataset of per-dataset XXH3s in state.h5

std::string step_dir_name(int64_t step) { return fmt::format("step-{:06d}", step); }

// The step-NNNNNN directories of a run folder, oldest first (none if the folder cannot be read).
std::vector<fs::path> step_dirs(const fs::path& out_dir) {
  std::vector<fs::path> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step-", 0) == 0) steps.push_back(e.path());
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// Σ loss and token counts over the ranks (host doubles: exact for counts below 2^53). With
// `stop_votes`, the same all-reduce also counts the ranks that received a stop signal
// (runtime/stop_request.h): every rank gets the same count, so all stop after the same step.
LossSums reduce_sums(Communicator& comm, const LossSums& local, int* stop_votes = nullptr) {
  Tensor buf = Tensor::empty({5}, DType::f64);
  double* b = buf.data_as<double>();
  b[0] = local.loss;
  b[1] = static_cast<double>(local.tokens);
  b[2] = local.answer_loss;
  b[3] = static_cast<double>(local.answer_tokens);
  b[4] = stop_votes && stop_signal() != 0 ? 1.0 : 0.0;
  all_reduce_sum_host(comm, buf);
  if (stop_votes) *stop_votes = static_cast<int>(b[4]);
  return LossSums{b[0], static_cast<int64_t>(b[1]), b[2], static_cast<int64_t>(b[3])};
}

// A line of train.jsonl; a failed write (a full disk) ends the run with a UserError.
void write_log_line(std::ofstream& jsonl, const fs::path& path, const nlohmann::json& line) {
  jsonl << line.dump() << std::endl;  // flushed: the file is complete after each line
  HYDRA_USER_CHECK(jsonl.good(), "writing {} failed (disk full or over a file size limit?)", path.string());
}

// The JSON fields of a loss split into retrieval answers and the rest (null where nothing counted).
nlohmann::json loss_fields(const LossSums& s, const std::string& prefix) {
  auto mean = [](double sum, int64_t n) { return n > 0 ? nlohmann::json(sum / static_cast<double>(n)) : nlohmann::json(); };
  return {{prefix + "answer_loss", mean(s.answer_loss, s.answer_tokens)},
          {prefix + "answer_tokens", s.answer_tokens},
          {prefix + "other_loss", mean(s.loss - s.answer_loss, s.tokens - s.answer_tokens)},
          {prefix + "counted_tokens", s.tokens}};
}

double peak_memory_gib(Device device) {
#if HYDRA_CUDA
  if (device == Device::cuda) return static_cast<double>(cuda_memory_stats().peak) / (1024.0 * 1024.0 * 1024.0);
#endif
  (void)device;
  return host_peak_memory_gib();
}

std::string format_duration(double s) {
  const int64_t t = static_cast<int64_t>(std::llround(std::max(0.0, s)));
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

struct Run {
  const TrainConfig& config;
  TrainTopology& topology;
  Model& student;
  const Model* teacher;
  AdamW& optimizer;
  PhaseTimer* timer = nullptr;  // the step's phases (GEMMs, FA, GDN, exposed communication, other)

  // The loss (and, with grads, the gradient) of a micro-batch: its windows packed into one sequence,
  // each window its own document (data.h pack_windows), spread over the sequence group.
  LossSums batch_loss(const std::vector<Window>& windows, double grad_scale, ModelTensors* grads,
                      std::vector<double>* layer_loss) {
    const PackedBatch batch = pack_windows(windows);
    const SequenceLayout layout = SequenceLayout::zigzag(static_cast<int64_t>(batch.ids.size()), topology.sp(),
                                                         topology.sequence().rank(), batch.document_starts);
    const TokenRows w = layout.rows_of(batch.ids, batch.targets, batch.answer);
    ForwardContext context{
        .comm = topology.sequence(), .layout = layout, .timer = timer, .keep = config.kept};
    switch (config.stage) {
      case Stage::pretrain:
      case Stage::finetune:
        return sequence_gradients(context, student, w, Objective::cross_entropy, grad_scale, grads);
      case Stage::distill:
        return sequence_gradients(context, student, w, Objective::distillation, grad_scale, grads, teacher);
      case Stage::align: {
        std::vector<double> per_layer;
        const LossSums s = alignment_gradients(context, student, *teacher, w.ids, grad_scale, grads, &per_layer);
        if (layer_loss) {
          layer_loss->resize(per_layer.size(), 0.0);
          for (size_t l = 0; l < per_layer.size(); ++l) (*layer_loss)[l] += per_layer[l];
        }
        return s;
      }
    }
    return {};
  }
};

// Writes step-NNNNNN (rank 0) and returns its path; logs a line with its size and the seconds taken.
// What a checkpoint holds: the master weights (model.h5) and the optimizer state (state.h5).
struct SavedState {
  NamedTensors masters, state;
};

// The checkpoint's tensors on rank 0: with a sharded optimizer every rank takes part in gathering
// them (collective); replicated, rank 0 holds them already and the others return nothing.
SavedState state_to_save(const AdamW& optimizer, bool lead) {
  SavedState saved;
  if (optimizer.zero() == Zero::replicated && !lead) return saved;
  saved.masters = optimizer.master_parameters(lead);
  saved.state = optimizer.state(lead);
  return saved;
}

std::string write_checkpoint_dir(const TrainConfig& config, const TrainTopology& topology, const Model& student,
                                 const SavedState& saved, int64_t step, int64_t position) {
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path out(config.out_dir), final_dir = out / step_dir_name(step);
  // The step is written under `.step-NNNNNN.tmp-PID` (the AtomicFile naming, so the same sweep finds
  // it after a kill -9) and registered for removal on SIGTERM/SIGINT until it is renamed; a save
  // that fails (a full disk) removes it before the error propagates.
  const fs::path temp = temporary_path_for(final_dir.string());
  fs::remove_all(temp);
  ScopedTemporary registration(temp.string(), ScopedTemporary::Kind::directory);
  struct RemoveUnlessRenamed {
    const fs::path& dir;
    bool renamed = false;
    ~RemoveUnlessRenamed() {
      std::error_code ec;
      if (!renamed) fs::remove_all(dir, ec);
    }
  } cleanup{temp};
  std::error_code ec;
  fs::create_directories(temp, ec);
  HYDRA_USER_CHECK(!ec, "saving step {}: cannot create {}: {}", step, temp.string(), ec.message());
  write_model_checkpoint((temp / "model.h5").string(), student.config(), saved.masters);
  maybe_inject_fault("save");
  {
    AtomicFile file((temp / "state.h5").string());
    H5File h5 = H5File::create(file.temp_path());
    // Every dataset's XXH3 and the inputs' fingerprints, verified by --resume (read_verified_state).
    // The checksums are a dataset (JSON text as bytes): an attribute is limited to 64 KiB.
    nlohmann::json checksums = nlohmann::json::object(), inputs = nlohmann::json::object();
    for (const auto& [name, t] : saved.state) {
      h5.write(name, t);
      checksums[name] = hash_hex(hash_tensor(t));
    }
    const std::string checksum_text = checksums.dump();
    h5.write_uint8(kChecksums, {reinterpret_cast<const uint8_t*>(checksum_text.data()), checksum_text.size()});
    for (const TrainConfig::Input& in : config.inputs) inputs[in.role] = in.hash;
    h5.set_attribute("inputs", inputs.dump());
    h5.set_attribute("format", std::string(kStateFormat));
    h5.set_attribute("format_version", kStateVersion);
    h5.set_attribute("stage", std::string(stage_name(config.stage)));
    h5.set_attribute("step", step);
    h5.set_attribute("data_position", position);
    h5.set_attribute("seed", static_cast<int64_t>(config.seed));
    h5.set_attribute("seq_len", config.seq_len);
    h5.set_attribute("world_size", static_cast<int64_t>(const_cast<TrainTopology&>(topology).world().size()));
    h5.set_attribute("sp", static_cast<int64_t>(topology.sp()));
    h5.set_attribute("config", config_to_json(student.config()).dump());
    h5.close();
    file.commit();
  }
  if (fs::exists(final_dir)) fs::remove_all(final_dir);  // a re-save of the same step (after a resume)
  fs::rename(temp, final_dir, ec);
  HYDRA_USER_CHECK(!ec, "saving step {}: cannot rename {} to {}: {}", step, temp.string(), final_dir.string(),
                   ec.message());
  cleanup.renamed = true;
  registration.release();
  write_text_atomically((out / "latest").string(), step_dir_name(step) + "\n");
  uintmax_t bytes = 0;
  for (const auto& e : fs::directory_iterator(final_dir)) bytes += e.is_regular_file() ? e.file_size() : 0;
  log::info("saved {} ({:.1f} MiB in {:.1f} s)", final_dir.string(), static_cast<double>(bytes) / (1024.0 * 1024.0),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  // Keep the newest `keep` step directories.
  const std::vector<fs::path> steps = step_dirs(out);
  for (size_t i = 0; i + static_cast<size_t>(std::max<int64_t>(config.keep, 1)) < steps.size(); ++i) {
    if (steps[i] != final_dir) fs::remove_all(steps[i]);
  }
  return final_dir.string();
}

// A save interrupted by a crash or kill -9 leaves its temporary step directory (.step-NNNNNN.tmp-PID,
// as large as a checkpoint; SIGTERM/SIGINT remove it themselves); the run that takes over the
// directory removes those whose process is gone.
void remove_interrupted_saves(const fs::path& out) {
  for (const std::string& path : sweep_stale_temporaries(out.string(), "step-", true)) {
    log::info("removed {} (a checkpoint save that did not finish)", path);
  }
}

// On --resume, the log keeps the steps up to the checkpoint: steps that ran after it (before the
// interruption) run again and are logged again, so each step appears once.
void truncate_log(const fs::path& path, int64_t last_kept_step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() > last_kept_step) {
      continue;
    }
    kept += line + "\n";
  }
  in.close();
  write_text_atomically(path.string(), kept);
}

// A state.h5 read whole and checked: every dataset against its stored XXH3, finite fp32 values
// (second moments ≥ 0), attributes in range. Any damage is a UserError naming the file.
struct VerifiedState {
  int64_t version = 0, step = 0, position = 0, world = 0, sp = 0, seq_len = 0, seed = 0;
  std::string stage, config;
  nlohmann::json inputs;  // role → XXH3 hex (version 2)
  NamedTensors tensors;
};

VerifiedState read_verified_state(const std::string& path) {
  const std::string advice = "(a damaged training state: resume from an older step-NNNNNN by pointing 'latest' at it)";
  try {
    require_readable_file(path, "training state");
    const H5File h5 = H5File::open_read(path);
    HYDRA_USER_CHECK(h5.has_attribute("format") && h5.string_attribute("format") == kStateFormat,
                     "{}: not a hydra training state", path);
    VerifiedState st;
    st.version = h5.int_attribute("format_version");
    HYDRA_USER_CHECK(st.version >= 1 && st.version <= kStateVersion, "{}: format_version {} is not one this hydra reads (1..{})",
                     path, st.version, kStateVersion);
    st.stage = h5.string_attribute("stage");
    st.config = h5.string_attribute("config");
    st.step = h5.int_attribute("step");
    st.position = h5.int_attribute("data_position");
    st.world = h5.int_attribute("world_size");
    st.sp = h5.int_attribute("sp");
    st.seq_len = h5.int_attribute("seq_len");
    st.seed = h5.int_attribute("seed");
    HYDRA_USER_CHECK(st.step >= 1 && st.position >= 0 && st.world >= 1 && st.sp >= 1 && st.world % st.sp == 0 &&
                         st.seq_len >= 1,
                     "{}: attributes out of range (step {}, data_position {}, world_size {}, sp {}, seq_len {}) {}", path,
                     st.step, st.position, st.world, st.sp, st.seq_len, advice);
    nlohmann::json checksums;
    if (st.version >= 2) {
      const std::vector<int64_t> bytes = h5.read_integer_vector(kChecksums);
      std::string text(bytes.size(), '\0');
      for (size_t i = 0; i < bytes.size(); ++i) text[i] = static_cast<char>(bytes[i]);
      checksums = nlohmann::json::parse(text, nullptr, false);
      st.inputs = nlohmann::json::parse(h5.string_attribute("inputs"), nullptr, false);
      HYDRA_USER_CHECK(checksums.is_object() && st.inputs.is_object(), "{}: its checksums or inputs are not readable {}",
                       path, advice);
    }
    for (const std::string& name : h5.dataset_names()) {
      if (name == kChecksums) continue;
      Tensor t = h5.read(name);
      HYDRA_USER_CHECK(t.dtype() == DType::f32, "{}: dataset '{}' is {}, not f32 {}", path, name, dtype_name(t.dtype()), advice);
      if (st.version >= 2) {
        HYDRA_USER_CHECK(checksums.contains(name) && checksums[name].is_string(), "{}: dataset '{}' has no checksum {}", path,
                         name, advice);
        HYDRA_USER_CHECK(checksums[name].get<std::string>() == hash_hex(hash_tensor(t)),
                         "{}: dataset '{}' does not match its checksum {}", path, name, advice);
      }
      const float* v = t.data_as<float>();
      const bool second_moment = name.rfind("adam_v.", 0) == 0;
      for (int64_t i = 0; i < t.numel(); ++i) {
        HYDRA_USER_CHECK(std::isfinite(v[i]) && (!second_moment || v[i] >= 0), "{}: dataset '{}' holds {} at element {} {}",
                         path, name, v[i], i, advice);
      }
      st.tensors.emplace(name, std::move(t));
    }
    if (st.version >= 2) {
      for (const auto& [name, hash] : checksums.items()) {
        HYDRA_USER_CHECK(st.tensors.count(name) == 1, "{}: dataset '{}' is missing {}", path, name, advice);
      }
    }
    return st;
  } catch (const UserError& e) {
    const std::string what = e.what();
    if (what.find(path) != std::string::npos) throw;
    HYDRA_USER_FAIL("{}: {} {}", path, what, advice);
  } catch (const std::exception& e) {
    HYDRA_USER_FAIL("{}: cannot be read ({}) {}", path, e.what(), advice);
  }
}

struct ResumePoint {
  int64_t step = 0, position = 0;
};

ResumePoint load_checkpoint_dir(const TrainConfig& config, TrainTopology& topology, const Model& student,
                                AdamW& optimizer, bool lead) {
  const std::string dir = latest_checkpoint(config.out_dir);
  HYDRA_USER_CHECK(!dir.empty(), "--resume: {} holds no checkpoint (no 'latest' pointer)", config.out_dir);
  const std::string path = dir + "/state.h5";
  const VerifiedState st = read_verified_state(path);
  HYDRA_USER_CHECK(st.stage == stage_name(config.stage), "--resume: {} was saved by stage {}, this run is stage {}", path,
                   st.stage, stage_name(config.stage));
  HYDRA_USER_CHECK(st.world == topology.world().size() && st.sp == topology.sp(),
                   "--resume: {} was saved by {} ranks (sequence groups of {}), this run has {} ranks (groups of {}); "
                   "resume on the same layout (resharding the optimizer state is not supported)", path, st.world, st.sp,
                   topology.world().size(), topology.sp());
  HYDRA_USER_CHECK(st.config == config_to_json(student.config()).dump(),
                   "--resume: {} was saved for another model (its config differs from --model's: {} vs {})", path,
                   config_from_json(nlohmann::json::parse(st.config), path).summary(), student.config().summary());
  HYDRA_USER_CHECK(st.seq_len == config.seq_len && static_cast<uint64_t>(st.seed) == config.seed,
                   "--resume: {} was saved with --seq-len {} --seed {}; this run has --seq-len {} --seed {}", path,
                   st.seq_len, st.seed, config.seq_len, config.seed);
  // The inputs' contents: the same bytes as when the run started, unless the user says the change is meant.
  if (st.version < 2) {
    if (lead) log::warn("--resume: {} was written by an older hydra (no checksums, no input fingerprints): not verified", path);
  } else {
    std::vector<std::string> changed;
    for (const TrainConfig::Input& in : config.inputs) {
      const std::string saved = st.inputs.contains(in.role) && st.inputs[in.role].is_string() ? st.inputs[in.role].get<std::string>() : "";
      if (saved != in.hash) {
        changed.push_back(fmt::format("{} {} ({})", in.role, in.path,
                                      saved.empty() ? "not part of the saved run" : "other contents: XXH3 " + in.hash +
                                                                                       ", saved " + saved));
      }
    }
    for (const auto& [role, hash] : st.inputs.items()) {
      bool given = false;
      for (const TrainConfig::Input& in : config.inputs) given = given || in.role == role;
      if (!given) changed.push_back(fmt::format("{} (saved, not given now)", role));
    }
    if (!changed.empty()) {
      std::string list;
      for (const std::string& c : changed) list += (list.empty() ? "" : "; ") + c;
      HYDRA_USER_CHECK(config.allow_changed_inputs,
                       "--resume: the inputs differ from those {} was trained on: {}; pass --allow-changed-inputs if "
                       "the change is meant", dir, list);
      if (lead) log::warn("--resume with --allow-changed-inputs: {}", list);
    }
  }
  optimizer.load_state(st.tensors);
  return ResumePoint{st.step, st.position};
}

}  // namespace

Stage parse_stage(const std::string& name) {
  for (Stage s : {Stage::pretrain, Stage::align, Stage::distill, Stage::finetune}) {
    if (name == stage_name(s)) return s;
  }
  HYDRA_USER_FAIL("--stage {} is not a stage (pretrain, align, distill, finetune)", name);
}

const char* stage_name(Stage stage) {
  switch (stage) {
    case Stage::pretrain: return "pretrain";
    case Stage::align: return "align";
    case Stage::distill: return "distill";
    case Stage::finetune: return "finetune";
  }
  return "?";
}

TrainTopology::TrainTopology(Communicator& world, int sp) : world_(world) {
  const int p = world.size();
  if (sp == 0) sp = p;
  HYDRA_USER_CHECK(sp >= 1 && p % sp == 0, "--sp {} must divide the number of ranks ({})", sp, p);
  replicas_ = p / sp;
  replica_ = world.rank() / sp;
  if (sp == p) {
    sequence_ = &world;
  } else {
    owned_ = world.split(replica_, world.rank());
    sequence_ = owned_.get();
  }
}

std::string newest_verified_checkpoint(const std::string& out_dir) {
  std::vector<fs::path> steps = step_dirs(out_dir);
  std::reverse(steps.begin(), steps.end());
  for (const fs::path& dir : steps) {
    try {
      read_verified_state((dir / "state.h5").string());
      return dir.string();
    } catch (const UserError& e) {
      log::warn("{}", e.what());
    }
  }
  return "";
}

std::string latest_checkpoint(const std::string& out_dir) {
  std::ifstream in(fs::path(out_dir) / "latest");
  std::string name;
  if (!(in >> name)) return "";
  const fs::path dir = fs::path(out_dir) / name;
  HYDRA_USER_CHECK(fs::is_directory(dir), "{}/latest names {}, which does not exist", out_dir, name);
  return dir.string();
}

TrainSummary run_training(const TrainConfig& config, TrainTopology& topology, Model& student, const Model* teacher) {
  Communicator& world = topology.world();
  const bool lead = world.rank() == 0;
  const ModelConfig& mc = student.config();
  const bool needs_teacher = config.stage == Stage::align || config.stage == Stage::distill;
  HYDRA_USER_CHECK(!needs_teacher || teacher, "--stage {} needs --teacher", stage_name(config.stage));
  HYDRA_USER_CHECK(config.stage != Stage::align || config.train == TrainSet::attention,
                   "--stage align trains only the attention block (--train attention)");
  HYDRA_USER_CHECK(config.steps >= 1 && config.batch_seqs >= 1 && config.grad_accum >= 1,
                   "--steps, --batch-seqs and --grad-accum must be at least 1");
  // From here on SIGTERM/SIGINT/SIGUSR1 ask for a stop after the current step (runtime/stop_request.h).
  const StopRequestScope stop_scope;
  const TokenWindows data(config.data, config.seq_len, config.seed, mc.vocab_size);
  std::optional<TokenWindows> eval;
  if (!config.eval_data.empty()) eval.emplace(config.eval_data, config.seq_len, 0, mc.vocab_size);
  SequenceLayout::zigzag(config.seq_len, topology.sp(), topology.sequence().rank());  // admissible window length

  OptimizerConfig optim = config.optim;
  optim.total_steps = config.steps;
  const auto trainable = [&](const std::string& name) {
    return config.train == TrainSet::all || param_traits(name).attention_block;
  };
  AdamW optimizer(student, optim, trainable, &topology.world(), config.zero);
  PhaseTimer timer(student.device());
  Run run{config, topology, student, teacher, optimizer, &timer};

  int64_t first_step = 1, position = 0;
  if (config.resume) {
    const ResumePoint at = load_checkpoint_dir(config, topology, student, optimizer, lead);
    first_step = at.step + 1;
    position = at.position;
    HYDRA_USER_CHECK(first_step <= config.steps, "--resume: the checkpoint is at step {}, --steps is {}: nothing to do",
                     at.step, config.steps);
  } else {
    HYDRA_USER_CHECK(latest_checkpoint(config.out_dir).empty(),
                     "{} already holds a training run (latest: {}); pass --resume to continue it or choose another "
                     "--out-dir", config.out_dir, latest_checkpoint(config.out_dir));
    // A log without a checkpoint (a run with --save-every -1, or one that failed before its first
    // save): a fresh run never appends to another run's steps.
    std::error_code ec;
    HYDRA_USER_CHECK(fs::file_size(fs::path(config.out_dir) / "train.jsonl", ec) == 0 || ec,
                     "{} holds the train.jsonl of another run (without a checkpoint); remove it or choose another "
                     "--out-dir", config.out_dir);
  }
  // The windows of one step must be distinct windows of the data.
  const int64_t windows_per_step = config.batch_seqs * config.grad_accum * topology.replicas();
  HYDRA_USER_CHECK(windows_per_step <= data.count(),
                   "a step takes {} windows (--batch-seqs {} × --grad-accum {} × {} replica(s)), the data holds {} of "
                   "{} tokens: a step would train on the same window twice; lower --batch-seqs/--grad-accum or add data",
                   windows_per_step, config.batch_seqs, config.grad_accum, topology.replicas(), data.count(),
                   config.seq_len + 1);
  if (lead) {
    std::error_code ec;
    fs::create_directories(config.out_dir, ec);
    HYDRA_USER_CHECK(!ec, "--out-dir {} cannot be created: {}", config.out_dir, ec.message());
    remove_interrupted_saves(config.out_dir);
    if (config.resume) truncate_log(fs::path(config.out_dir) / "train.jsonl", first_step - 1);
  }
  const int64_t last_step = config.stop_at > 0 ? std::min(config.stop_at, config.steps) : config.steps;
  HYDRA_USER_CHECK(last_step >= first_step, "--stop-at {} is before the first step of this run ({})", config.stop_at,
                   first_step);
  std::ofstream jsonl;
  const fs::path log_path = fs::path(config.out_dir) / "train.jsonl";
  if (lead) {
    jsonl.open(log_path, std::ios::app);
    HYDRA_USER_CHECK(jsonl.is_open(), "cannot open {} for writing", log_path.string());
  }

  const int64_t per_replica = config.batch_seqs * config.grad_accum, replicas = topology.replicas();
  const int64_t step_tokens = per_replica * replicas * config.seq_len;
  // The gradient is the mean over the step's counted targets (DESIGN.md §1.5): every rank reads the
  // whole data, so each computes the global count of the step's windows itself, before any forward.
  // Alignment matches every position's layer output: loss masks do not apply to it.
  // Targets that cross a document boundary never count either, mask or not (data.h counted_targets).
  auto step_count = [&](int64_t position) {
    if (config.stage == Stage::align) return step_tokens;
    int64_t n = 0;
    for (int64_t w = 0; w < per_replica * replicas; ++w) n += data.counted_targets(position + w);
    return n;
  };
  if (lead && config.stage == Stage::align && data.masked()) {
    log::warn("train align: the data's loss_mask is ignored: alignment matches the layer outputs at every position");
  }
  // Model FLOPs: 3 × the student's forward, the LM head included where the loss reads logits.
  const LogitHead head = config.stage == Stage::align ? LogitHead::none : LogitHead::every_position;
  const FlopCount window_flops = training_forward_flops(mc, config.seq_len, head);
  const double windows = static_cast<double>(per_replica * replicas);
  const double step_flops = 3.0 * window_flops.total() * windows, lm_head_flops = 3.0 * window_flops.logits * windows;
  if (lead) {
    log::info("train {}: {} steps of {} tokens ({} window(s) of {} × {} replica(s) × {} accumulation), {} rank(s) "
              "(sequence groups of {}), {} of {} parameters trained, data {} windows ({} tokens){}",
              stage_name(config.stage), config.steps, step_tokens, config.batch_seqs, config.seq_len, replicas,
              config.grad_accum, world.size(), topology.sp(), optimizer.trainable_parameters(), parameter_count(mc),
              data.count(), data.tokens(), config.resume ? fmt::format(", resumed at step {}", first_step) : "");
    if (student.device() == Device::cuda) {  // the CPU path has no meaningful peak: no MFU
      log::info("MFU counts {:.1f} TFLOP a step (3 × forward: layers {:.1f}, LM head {:.1f}) against {} TFLOP/s per rank",
                step_flops / 1e12, (step_flops - lm_head_flops) / 1e12, lm_head_flops / 1e12, config.peak_tflops);
    }
  }
  TrainSummary summary;
  summary.first_step = first_step;
  const auto start = std::chrono::steady_clock::now();
  double busy_s = 0;
  // NIAH accuracy at the training length: the same samples at every evaluation (eval-niah's
  // generator, seed fixed), depths spread over 0..100; each sequence group scores all of them.
  std::vector<niah::TaskParams> niah_tasks;
  for (const std::string& name : config.eval_niah_tasks) niah_tasks.push_back(niah::TaskParams{.task = niah::parse_task(name)});
  for (const niah::TaskParams& p : niah_tasks) {
    p.validate(mc.vocab_size);
    HYDRA_USER_CHECK(p.min_length() <= config.seq_len, "--eval-niah {}: a sample needs at least {} tokens, --seq-len is {}",
                     niah::task_name(p.task), p.min_length(), config.seq_len);
  }
  auto evaluate_niah = [&](int64_t step, nlohmann::json& line) {
    if (niah_tasks.empty()) return;
    summary.last_niah_accuracy.clear();
    std::string text;
    for (const niah::TaskParams& p : niah_tasks) {
      int64_t correct = 0;
      double logprob = 0;
      for (int64_t i = 0; i < config.eval_niah_samples; ++i) {
        const int64_t depth = config.eval_niah_samples > 1 ? 100 * i / (config.eval_niah_samples - 1) : 50;
        const niah::Sample sample = niah::generate_sample(p, mc.vocab_size, kNiahEvalSeed, config.seq_len, depth, i);
        const niah::AnswerScore score = niah::evaluate_sample(student, topology.sequence(), sample);
        correct += score.correct ? 1 : 0;
        logprob += score.logprob;
      }
      const double accuracy = static_cast<double>(correct) / static_cast<double>(config.eval_niah_samples);
      const std::string name = niah::task_name(p.task);
      summary.last_niah_accuracy.emplace_back(name, accuracy);
      line["niah_" + name] = accuracy;
      line["niah_" + name + "_logprob"] = logprob / static_cast<double>(config.eval_niah_samples);
      text += fmt::format(" {} {:.3f}", name, accuracy);
    }
    line["niah_samples"] = config.eval_niah_samples;
    if (lead) log::info("eval after step {}: NIAH accuracy at {} tokens ({} samples each):{}", step, config.seq_len,
                        config.eval_niah_samples, text);
  };
  auto evaluate = [&](int64_t step) {
    if (!eval && niah_tasks.empty()) return;
    nlohmann::json line{{"type", "eval"}, {"step", step}};
    run.timer = nullptr;  // the phases are the training step's
    if (eval) {
      const int64_t n = std::min(config.eval_windows, eval->count());
      LossSums local;
      // This replica's windows, packed batch_seqs at a time as in training.
      std::vector<Window> batch;
      for (int64_t i = topology.replica(); i < n; i += replicas) {
        batch.push_back(eval->window_in_order(i));
        if (static_cast<int64_t>(batch.size()) == config.batch_seqs || i + replicas >= n) {
          local += run.batch_loss(batch, 1.0, nullptr, nullptr);
          batch.clear();
        }
      }
      const LossSums total = reduce_sums(world, local);
      // Sequence-group ranks each counted their own tokens: the sums are already global.
      summary.last_eval_loss = total.loss / static_cast<double>(std::max<int64_t>(total.tokens, 1));
      const char* metric = config.stage == Stage::distill ? "kl" : config.stage == Stage::align ? "mse" : "cross_entropy";
      summary.eval_metric = metric;
      line.update({{"eval_loss", *summary.last_eval_loss}, {"eval_metric", metric}, {"windows", n}});
      if (config.stage != Stage::align) line.update(loss_fields(total, "eval_"));
      if (lead) log::info("eval after step {}: {} {:.4f} over {} windows{}", step, metric, *summary.last_eval_loss, n,
                          total.answer_tokens > 0 ? fmt::format(" (answers {:.4f} over {} targets)",
                                                                total.answer_loss / static_cast<double>(total.answer_tokens),
                                                                total.answer_tokens)
                                                  : "");
    }
    evaluate_niah(step, line);
    run.timer = &timer;
    if (lead) write_log_line(jsonl, log_path, line);
  };

  optimizer.zero_grads();  // and again after each step's update, for the next step (below)
  for (int64_t step = first_step; step <= last_step; ++step) {
    maybe_inject_fault("step");
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t counted = step_count(position);
    if (counted == 0) {  // nothing to learn from: no forward, no update, no division by zero
      if (lead) {
        log::warn("step {}: no target of its {} window(s) is counted (loss_mask); skipped without an update", step,
                  per_replica * replicas);
        write_log_line(jsonl, log_path,
                       nlohmann::json{{"type", "step"}, {"step", step}, {"loss", nullptr}, {"counted_tokens", 0},
                                      {"skipped", "no counted target"}, {"data_position", position + per_replica * replicas}});
      }
      position += per_replica * replicas;
      summary.last_step = step;
      if ((config.eval_every > 0 && step % config.eval_every == 0) || step == last_step) evaluate(step);
      continue;
    }
    const double grad_scale = 1.0 / static_cast<double>(counted);
    LossSums local;
    std::vector<double> layer_loss;
    // Micro-batch m of this replica: windows j = m·batch_seqs … (m+1)·batch_seqs − 1, window j at
    // data position + j·replicas + replica (the order is the same as one window at a time).
    for (int64_t m = 0; m < config.grad_accum; ++m) {
      std::vector<Window> batch;
      for (int64_t b = 0; b < config.batch_seqs; ++b) {
        const int64_t j = m * config.batch_seqs + b;
        batch.push_back(data.window(position + j * replicas + topology.replica()));
      }
      local += run.batch_loss(batch, grad_scale, &optimizer.grads(), &layer_loss);
    }
    position += per_replica * replicas;
    optimizer.reduce_gradients();  // all-reduced (--zero 0) or reduce-scattered into the owners (--zero 1)
    int stop_votes = 0;  // ranks that received a stop signal, the same count on every rank
    const LossSums total = reduce_sums(world, local, &stop_votes);
    HYDRA_ASSERT(config.stage == Stage::align || total.tokens == counted, "step {}: {} targets counted, {} expected", step,
                 total.tokens, counted);
    const double loss = total.loss / static_cast<double>(std::max<int64_t>(total.tokens, 1));
    const double grad_norm = optimizer.grad_norm();
    if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
      // The newest checkpoint whose state verifies (rank 0 reads them; the others name `latest`).
      const std::string last = lead ? newest_verified_checkpoint(config.out_dir) : latest_checkpoint(config.out_dir);
      HYDRA_USER_FAIL("step {}: the loss is {} (gradient norm {}); stopped before applying the update. The last good "
                      "checkpoint is {} (continue from it with --resume, e.g. with a lower --lr)", step, loss, grad_norm,
                      last.empty() ? "none: no checkpoint was written yet" : last);
    }
    const StepStats stats = optimizer.step(step, grad_norm);
    // The next step's gradients start from zero, queued behind the update (one launch on the GPU).
    optimizer.zero_grads();
    const auto phases = timer.finish();  // waits for the step's work (the update included)
    std::vector<double> layer_mean;  // align: each layer's mean loss over the step's tokens
    if (config.stage == Stage::align) {
      Tensor buf = Tensor::zeros({mc.num_layers}, DType::f64);
      for (size_t l = 0; l < layer_loss.size(); ++l) buf.data_as<double>()[l] = layer_loss[l];
      all_reduce_sum_host(world, buf);
      for (int64_t l = 0; l < mc.num_layers; ++l) layer_mean.push_back(buf.data_as<double>()[l] / static_cast<double>(total.tokens));
    }
    const auto t1 = std::chrono::steady_clock::now();
    const double step_s = std::chrono::duration<double>(t1 - t0).count();
    busy_s += step_s;
    const int64_t done = step - first_step + 1;
    const double tokens_per_s = static_cast<double>(step_tokens) / step_s;
    const double mfu = step_flops / step_s / (static_cast<double>(world.size()) * config.peak_tflops * 1e12);
    summary.last_step = step;
    summary.last_loss = loss;
    if (lead) {
      log::info("step {}/{}  loss {:.4f}  lr {:.2e}  grad-norm {:.3f}{}  {:.0f} tok/s  {:.2f} s/step  ETA {}  "
                "[gemm {:.2f} fa {:.2f} gdn {:.2f} comm {:.2f} other {:.2f} s]", step, config.steps, loss, stats.lr,
                grad_norm, stats.clip_scale < 1 ? " (clipped)" : "", tokens_per_s, step_s,
                format_duration(busy_s / static_cast<double>(done) * static_cast<double>(last_step - step)),
                phases[static_cast<size_t>(Phase::gemm)], phases[static_cast<size_t>(Phase::fa)],
                phases[static_cast<size_t>(Phase::gdn)], phases[static_cast<size_t>(Phase::comm)],
                phases[static_cast<size_t>(Phase::other)]);
      nlohmann::json line{{"type", "step"}, {"step", step}, {"loss", loss}, {"lr", stats.lr}, {"grad_norm", grad_norm},
                          {"clip_scale", stats.clip_scale}, {"tokens", step_tokens}, {"step_s", step_s},
                          {"tokens_per_s", tokens_per_s}, {"mfu", mfu}, {"data_position", position}};
      if (config.stage != Stage::align) line.update(loss_fields(total, ""));
      // Seconds per phase of the layers (forward, recompute, backward) on rank 0; the loss head and the
      // optimizer are the rest of step_s. Concurrent FA/GDN branches overlap, so phases can sum past it.
      nlohmann::json phase_s;
      for (size_t i = 0; i < phases.size(); ++i) phase_s[phase_name(static_cast<Phase>(i))] = phases[i];
      line["phases"] = phase_s;
      if (!layer_mean.empty()) line["layer_loss"] = layer_mean;
      write_log_line(jsonl, log_path, line);
    }
    if ((config.eval_every > 0 && step % config.eval_every == 0) || step == last_step) evaluate(step);
    // Saves: every --save-every steps, at the end (unless -1), and always at --stop-at (to resume from).
    const bool periodic = config.save_every > 0 && step % config.save_every == 0;
    const bool last = step == last_step && (config.save_every >= 0 || last_step < config.steps);
    // A stop signal on any rank: save this step (whatever --save-every says) and return.
    const bool stop = stop_votes > 0 && step < last_step;
    if (periodic || last || stop) {
      const SavedState saved = state_to_save(optimizer, lead);
      if (lead) summary.checkpoint = write_checkpoint_dir(config, topology, student, saved, step, position);
      world.barrier();
    }
    if (stop) {
      summary.stopped = true;
      summary.checkpoint = (fs::path(config.out_dir) / step_dir_name(step)).string();
      summary.stop_reason = stop_signal() != 0 ? signal_name(stop_signal()) : "a signal on another rank";
      break;
    }
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t steps_done = summary.last_step - first_step + 1;
  summary.tokens_per_s = static_cast<double>(step_tokens * steps_done) / busy_s;
  summary.mfu = step_flops * static_cast<double>(steps_done) / busy_s /
                (static_cast<double>(world.size()) * config.peak_tflops * 1e12);
  summary.peak_memory_gib = peak_memory_gib(student.device());
  summary.step_flops = step_flops;
  summary.lm_head_flops = lm_head_flops;
  return summary;
}

}  // namespace hydra::train
