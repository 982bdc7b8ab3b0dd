// hydra train: the four training stages (DESIGN.md §1.5) — pretrain, align, distill, finetune —
// on one rank or sequence/data parallel under mpirun (model/train/trainer.h). Parses flags, builds
// the student (and teacher), checks the memory plan, and hands over to train::run_training.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "launch/cli.h"
#include "launch/model_source.h"
#include "model/cost.h"
#include "model/eval/niah.h"
#include "model/memory_plan.h"
#include "model/sequence_length.h"
#include "model/train/data.h"
#include "model/train/trainer.h"
#include "model/train/training_plan.h"
#include "parallel/device_world.h"
#include "runtime/atomic_file.h"
#include "runtime/content_hash.h"
#include "runtime/log.h"
#include "runtime/sizes.h"
#include "runtime/stop_request.h"
#include "runtime/token_file.h"
#include "runtime/token_identity.h"
#if HYDRA_CUDA
#include "runtime/cuda_memory.h"
#endif

namespace hydra {
namespace {

// The content identity of every data input (runtime/token_identity.h), the same on every rank: rank
// 0 reads it from its cache, or reads each file once, and broadcasts it (the other ranks checked
// their copies against rank 0's in the agreement: token_file_sample); a computed identity's pass also
// counts the windows of --seq-len and caches them, so the data loader does not read the file again.
// Every rank then refuses ids outside the model's vocabulary, before any weight is read.
void add_data_identities(Communicator& world, std::vector<train::TrainConfig::Input>& inputs, int64_t vocab,
                         int64_t seq_len) {
  nlohmann::json ids = nlohmann::json::array();
  if (world.rank() == 0) {
    // One log line per corpus (a folder's shards together; a file alone is its own).
    struct Group {
      std::string role, name;
      int64_t files = 0, reused = 0;
      double seconds = 0, gb = 0;
    };
    std::vector<Group> groups;
    for (const train::TrainConfig::Input& in : inputs) {
      if (!in.hash.empty()) continue;  // the model's and teacher's: fingerprinted already
      const auto t0 = std::chrono::steady_clock::now();
      bool reused = false;
      const TokenFileIdentity id = token_file_identity(in.path, &reused, seq_len);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::error_code ec;
      const double gb = static_cast<double>(std::filesystem::file_size(in.path, ec)) / 1e9;
      const std::string role = in.role.substr(0, in.role.find_last_of(' '));  // "training data 3" -> "training data"
      const std::string name = in.corpus.empty() ? in.path : in.corpus;
      if (groups.empty() || groups.back().role != role || groups.back().name != name) groups.push_back({role, name});
      Group& g = groups.back();
      ++g.files;
      g.reused += reused ? 1 : 0;
      g.seconds += s;
      g.gb += reused ? 0.0 : gb;
      ids.push_back({id.fingerprint, id.min_id, id.max_id});
    }
    for (const Group& g : groups) {
      const int64_t computed = g.files - g.reused;
      const std::string what = g.files == 1 ? (g.reused ? "reused from the cache" : "computed")
                               : computed == 0 ? fmt::format("of its {} shards reused from the cache", g.files)
                               : fmt::format("of its {} shards computed for {}, reused for {}", g.files, computed, g.reused);
      log::info("{} {}: content identity {} in {:.2f} s{}", g.role, g.name, what, g.seconds,
                computed == 0 ? "" : fmt::format(" ({:.2f} GB, {:.2f} s/GB)", g.gb, g.seconds / std::max(g.gb, 1e-9)));
    }
  }
  // The JSON text, broadcast as its length and then its bytes (packed into int64s).
  std::string text = ids.dump();
  Tensor length = Tensor::empty({1}, DType::i64);
  length.data_as<int64_t>()[0] = static_cast<int64_t>(text.size());
  world.broadcast(length, 0);
  text.resize(static_cast<size_t>(length.data_as<int64_t>()[0]));
  Tensor bytes = Tensor::zeros({static_cast<int64_t>(text.size() + 7) / 8}, DType::i64);
  std::memcpy(bytes.data(), text.data(), text.size());
  world.broadcast(bytes, 0);
  std::memcpy(text.data(), bytes.data(), text.size());
  ids = nlohmann::json::parse(text);
  size_t k = 0;
  for (train::TrainConfig::Input& in : inputs) {
    if (!in.hash.empty()) continue;
    const nlohmann::json& id = ids.at(k++);
    in.hash = id.at(0).get<std::string>();
    const int64_t lo = id.at(1).get<int64_t>(), hi = id.at(2).get<int64_t>();
    HYDRA_USER_CHECK(lo >= 0 && hi < vocab, "{}: holds token ids {}..{}, outside the model's vocabulary [0, {})", in.path,
                     lo, hi, vocab);
  }
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// A real number given as text: the whole text, finite (UserError naming the flag otherwise).
double parse_finite(const std::string& text, const char* flag) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  HYDRA_USER_CHECK(!text.empty() && end == text.c_str() + text.size() && errno == 0 && std::isfinite(v),
                   "{} {}: not a finite number", flag, text);
  return v;
}

// `BINARY train ARGS --resume` as a shell line (single-quoted where needed), under mpirun for P > 1:
// BINARY is the executable that runs (its path as started, so the line works where this one did).
std::string resume_command(const std::string& binary, const std::vector<std::string>& args, int ranks) {
  const auto quote = [](const std::string& a) {
    const bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                                         "-_=.,/:+@%") == std::string::npos;
    if (plain) return a;
    std::string quoted = "'";
    for (char ch : a) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return quoted + "'";
  };
  std::string line = (ranks > 1 ? fmt::format("mpirun -np {} ", ranks) : std::string()) + quote(binary) + " train";
  bool resume = false;
  for (const std::string& a : args) {
    resume = resume || a == "--resume";
    line += ' ';
    line += quote(a);
  }
  return resume ? line : line + " --resume";
}

struct TrainOptions {
  std::string stage;
  ModelSource model;
  std::string teacher;
  std::string data, eval_data, seq_len, out_dir, train = "auto", device = "auto", kept_activations = "auto", eval_niah;
  std::string zero = "auto", cuda_graph = "auto";
  // Defaults that depend on the stage or on --steps: empty text = the default (validate() parses).
  std::string lr, min_lr, warmup, weight_decay;
  int64_t eval_niah_samples = 32;
  int64_t steps = 0, stop_at = 0, batch_seqs = 1, grad_accum = 1, save_every = 0, eval_every = 0, eval_windows = 8, keep = 2;
  double save_timeout = 0;
  double grad_clip = 1.0, peak_tflops = 989, nccl_timeout = 600;
  uint64_t seed = 0;
  bool resume = false, allow_changed_inputs = false;
  int sp = 0;

  void bind(po::options_description& o) {
    model.bind(o, ModelSource::OwnSeed::yes);  // --seed is the data order's
    o.add_options()
        ("stage", po::value(&stage)->required(), "pretrain | align | distill | finetune (defaults per stage below)")
        ("teacher", po::value(&teacher), "teacher checkpoint (align and distill: runs forward in the same process)")
        ("data", po::value(&data)->required(), "training corpora, comma-separated: token files (.h5 with input_ids [N]; an "
         "optional loss_mask [N] chooses the targets that count, document_offsets [D+1] packs documents that each run as if "
         "alone) or folders of shards from cluster/tokenize_text.py (the folder or its manifest.json); CORPUS:W gives a "
         "corpus a weight: a blend that draws each corpus's share of the windows (web/:0.7,code/:0.3; a corpus without a "
         "weight shares 1 − the weights given, in proportion to its windows; no weight at all: every window pooled)")
        ("seq-len", po::value(&seq_len)->required(), "tokens per sequence (window); accepts 4K, 128K; a multiple of 2·sp on sp ranks")
        ("steps", po::value(&steps)->required(), "optimizer steps (the learning-rate schedule's length)")
        ("stop-at", po::value(&stop_at)->default_value(0), "stop after this step with a checkpoint (0: --steps); continue later with --resume — for runs split over time-limited allocations")
        ("out-dir", po::value(&out_dir)->required(), "checkpoints (step-N/: model.h5, each rank's optimizer shard, manifest.json), the 'latest' pointer, train.jsonl")
        ("lr", po::value(&lr), "peak learning rate, > 0 (default: the stage's: pretrain 1e-3, align 1e-3, distill 1e-4, finetune 2e-5)")
        ("min-lr", po::value(&min_lr), "learning rate at the last step, cosine decay, in [0, lr] (default: lr / 10)")
        ("warmup", po::value(&warmup), "linear warmup steps, in [0, --steps] (default: 5% of --steps, at most 100)")
        ("weight-decay", po::value(&weight_decay), "AdamW decoupled weight decay, >= 0, not on norms, gates, A_log, dt_bias, gamma (default: pretrain 0.1, others 0.01)")
        ("grad-clip", po::value(&grad_clip)->default_value(1.0), "clip the global gradient norm to this (0: off)")
        ("batch-seqs", po::value(&batch_seqs)->default_value(1), "windows per micro-batch per data-parallel replica, packed into one sequence (each window its own document: the same math as one at a time, one long sequence for the GPU; memory grows with it)")
        ("grad-accum", po::value(&grad_accum)->default_value(1), "micro-batches accumulated per step (the loss is the mean over all their tokens)")
        ("seed", po::value(&seed)->default_value(0), "seed of the data order")
        ("save-every", po::value(&save_every)->default_value(0), "checkpoint every N steps (0: only at the end; -1: never, for benchmarks)")
        ("eval-every", po::value(&eval_every)->default_value(0), "evaluation every N steps (0: only at the end): the loss on --eval-data and the --eval-niah accuracy")
        ("eval-data", po::value(&eval_data), "held-out corpora, comma-separated, for the evaluation loss (files or shard folders; CORPUS:W: a blend, as --data; each corpus in its own order)")
        ("eval-windows", po::value(&eval_windows)->default_value(8), "windows of --eval-data per evaluation (the first N, always the same)")
        ("eval-niah", po::value(&eval_niah), "NIAH or RULER tasks scored at every evaluation at the training length, comma-separated (single, multikey, multivalue; multiquery, vartrack, cwe, fwe at eval-niah's default knobs): greedy accuracy in train.jsonl")
        ("eval-niah-samples", po::value(&eval_niah_samples)->default_value(32), "NIAH samples per task and evaluation (depths spread over 0..100; the same samples every time), split over the data-parallel replicas")
        ("keep", po::value(&keep)->default_value(2), "checkpoints kept in --out-dir (the newest)")
        ("save-timeout", po::value(&save_timeout)->default_value(0), "seconds a checkpoint's save may take before the job ends (every rank writes its shard at once; 0: 120 s + the largest rank's bytes at 20 MB/s)")
        ("train", po::value(&train)->default_value("auto"), "attention (the attention block only) | all (default: attention for align, all otherwise)")
        ("resume", po::bool_switch(&resume), "continue the run in --out-dir from its latest checkpoint (same model and data; another world size or --sp needs the same windows per step, --batch-seqs × --grad-accum × replicas; the state's checksums and the inputs' contents are verified)")
        ("allow-changed-inputs", po::bool_switch(&allow_changed_inputs), "with --resume: accept a model, teacher or data file whose contents differ from those the run was trained on (the model's and teacher's XXH3 and the data's content identities are stored in every checkpoint's manifest.json)")
        ("device", po::value(&device)->default_value("auto"), "cuda (bf16 weights, fp32 masters), cpu (fp32) or auto")
        ("sp", po::value(&sp)->default_value(0), "ranks per sequence (sequence parallel); world / sp data-parallel replicas (0: all ranks)")
        ("zero", po::value(&zero)->default_value("auto"), "optimizer state: 1 spreads the fp32 masters and AdamW moments over all ranks (ZeRO-1: 12/W bytes a trained parameter per rank; gradients reduce-scattered, weights all-gathered), 0 keeps all of it on every rank (its gradients summed in the same order: the same numbers, bit for bit on the CPU); auto: 1 on more than one rank")
        ("peak-tflops", po::value(&peak_tflops)->default_value(989), "dense bf16 peak per GPU for MFU (989: H100/H200 datasheet); MFU = 3 × the forward FLOPs of the step's windows (layers and, except in align, the LM head over every position) / step time / (ranks × peak)")
        ("kept-activations", po::value(&kept_activations)->default_value("auto"), "what the forward keeps for the backward beyond each layer's input: none | gdn (the GDN outputs: no delta-rule rerun) | gdn+proj (also the fused projection: no in_proj GEMM) | gdn+proj+mlp (also every layer's MLP gate/up: no mlp_in GEMM) | auto (the most that the memory plan fits on every rank, in that order, the MLP's for as many layers as fit)")
        ("cuda-graph", po::value(&cuda_graph)->default_value(cuda_graph)->implicit_value("on"), "on, off or auto: on replays each step's micro-batches (forward and backward) as one CUDA graph, captured at the second step (the GPU, --sp 1, pretrain or finetune; the kernels of off in the same order: the same losses and weights, up to the GPU backward's run-to-run last bits; on one GPU the norm, clip, non-finite guard, update and zeroing are in the graph too and each step's loss and norm are logged one step late, evaluation and save steps read at once; with replicas the reductions, norm and update stay eager; no per-phase times in the log). Its step arena holds the SUM of a micro-batch's allocations, not their peak: for small models (the memory plan is checked with it). auto: off (on an H100 it made qwen3-synth's step 1.2x faster; unmeasured on large steps)")
        ("nccl-timeout", po::value(&nccl_timeout)->default_value(600), "seconds before a stuck NCCL operation ends the job");
  }
  // The stage's defaults (model/train/stage.cpp) for the flags left out, and every number checked
  // (finite, in range). All stages: warmup 5% of --steps (at most 100), AdamW β 0.9/0.95, ε 1e-8.
  train::OptimizerConfig optimizer(train::Stage stage) const {
    const train::StageTraits& d = train::stage_traits(stage);
    train::OptimizerConfig o;
    o.lr = lr.empty() ? d.lr : parse_finite(lr, "--lr");
    HYDRA_USER_CHECK(o.lr > 0, "--lr {} must be above 0", lr);
    o.min_lr = min_lr.empty() ? o.lr / 10 : parse_finite(min_lr, "--min-lr");
    HYDRA_USER_CHECK(o.min_lr >= 0 && o.min_lr <= o.lr, "--min-lr {} must lie in [0, --lr {}]", o.min_lr, o.lr);
    o.weight_decay = weight_decay.empty() ? d.weight_decay : parse_finite(weight_decay, "--weight-decay");
    HYDRA_USER_CHECK(o.weight_decay >= 0, "--weight-decay {} must not be negative", weight_decay);
    if (warmup.empty()) {
      o.warmup = std::min<int64_t>(100, steps / 20);
    } else {
      const double w = parse_finite(warmup, "--warmup");
      HYDRA_USER_CHECK(w == std::floor(w) && w >= 0 && w <= static_cast<double>(steps),
                       "--warmup {} must be a whole number of steps in [0, --steps {}]", warmup, steps);
      o.warmup = static_cast<int64_t>(w);
    }
    o.grad_clip = grad_clip;
    return o;
  }
  void validate() const {
    model.validate();
    train::parse_stage(stage);
    const std::vector<train::DataSource> sources = train::parse_data_sources(data, "--data");
    for (const train::DataSource& f : sources) require_readable_file(f.path, "training data");
    HYDRA_USER_CHECK(!sources.empty(), "--data names no file");
    for (const train::DataSource& f : train::parse_data_sources(eval_data, "--eval-data")) {
      require_readable_file(f.path, "evaluation data");
    }
    if (!teacher.empty()) require_readable_file(teacher, "teacher");
    parse_size(seq_len, "--seq-len");
    HYDRA_USER_CHECK(steps >= 1, "--steps must be at least 1");
    HYDRA_USER_CHECK(batch_seqs >= 1 && grad_accum >= 1 && keep >= 1 && eval_windows >= 1 && eval_niah_samples >= 1,
                     "--batch-seqs, --grad-accum, --keep, --eval-windows and --eval-niah-samples must be at least 1");
    for (const std::string& t : split_list(eval_niah)) niah::parse_task(t);
    HYDRA_USER_CHECK(stop_at >= 0, "--stop-at must not be negative");
    HYDRA_USER_CHECK(std::isfinite(save_timeout) && save_timeout >= 0, "--save-timeout must be 0 (sized to the save) or a number of seconds");
    HYDRA_USER_CHECK(save_every >= -1, "--save-every must be -1 (never), 0 (at the end) or a step count");
    HYDRA_USER_CHECK(eval_every >= 0, "--eval-every must not be negative");
    HYDRA_USER_CHECK(std::isfinite(grad_clip) && grad_clip >= 0, "--grad-clip must be a finite number, 0 or more");
    HYDRA_USER_CHECK(std::isfinite(peak_tflops) && peak_tflops > 0, "--peak-tflops must be a finite number above 0");
    HYDRA_USER_CHECK(std::isfinite(nccl_timeout) && nccl_timeout > 0, "--nccl-timeout must be a finite number of seconds above 0");
    HYDRA_USER_CHECK(eval_every == 0 || !eval_data.empty() || !eval_niah.empty(),
                     "--eval-every {} needs something to evaluate: --eval-data or --eval-niah", eval_every);
    HYDRA_USER_CHECK(!allow_changed_inputs || resume, "--allow-changed-inputs goes with --resume");
    optimizer(train::parse_stage(stage));  // the learning-rate flags
    require_output_directory(out_dir, "--out-dir");
    HYDRA_USER_CHECK(train == "auto" || train == "all" || train == "attention", "--train must be attention, all or auto");
    HYDRA_USER_CHECK(sp >= 0, "--sp must not be negative");
    HYDRA_USER_CHECK(zero == "auto" || zero == "0" || zero == "1", "--zero must be 0, 1 or auto (got '{}')", zero);
    parse_kept_policy(kept_activations);
    train::parse_train_graph(cuda_graph);
  }
};

// The run's configuration from the flags (validated already); warns (rank 0) about what is legal
// but likely a mistake.
train::TrainConfig train_config(const TrainOptions& opt, Communicator& world) {
  train::TrainConfig c;
  c.stage = train::parse_stage(opt.stage);
  for (const train::DataSource& f : train::parse_data_sources(opt.data, "--data")) {
    c.data.push_back(f.path);
    c.data_weights.push_back(f.weight);
    c.data_corpora.push_back(f.corpus);
  }
  for (const train::DataSource& f : train::parse_data_sources(opt.eval_data, "--eval-data")) {
    c.eval_data.push_back(f.path);
    c.eval_weights.push_back(f.weight);
    c.eval_corpora.push_back(f.corpus);
  }
  c.seq_len = parse_size(opt.seq_len, "--seq-len");
  c.steps = opt.steps;
  c.stop_at = opt.stop_at;
  c.batch_seqs = opt.batch_seqs;
  c.grad_accum = opt.grad_accum;
  c.seed = opt.seed;
  c.save_every = opt.save_every;
  c.eval_every = opt.eval_every;
  c.eval_windows = opt.eval_windows;
  c.eval_niah_tasks = split_list(opt.eval_niah);
  c.eval_niah_samples = opt.eval_niah_samples;
  c.keep = opt.keep;
  c.save_timeout = opt.save_timeout;
  const train::StageTraits& stage = train::stage_traits(c.stage);
  c.train = opt.train == "all" ? train::TrainSet::all : opt.train == "attention" ? train::TrainSet::attention : stage.trains;
  c.optim = opt.optimizer(c.stage);
  c.out_dir = opt.out_dir;
  c.resume = opt.resume;
  c.allow_changed_inputs = opt.allow_changed_inputs;
  if (world.rank() == 0) {  // surprising but legal
    if (opt.stop_at > opt.steps) log::warn("--stop-at {} is past --steps {}: the run ends at step {}", opt.stop_at, opt.steps, opt.steps);
    if (c.optim.lr * c.optim.weight_decay >= 1) {
      log::warn("--lr {} × --weight-decay {} is 1 or more: the decay multiplies every weight by 1 − lr·wd ≤ 0 each step",
                c.optim.lr, c.optim.weight_decay);
    }
    if (opt.save_every > opt.steps) log::warn("--save-every {} is past --steps {}: only the end is saved", opt.save_every, opt.steps);
  }
  c.sp = opt.sp;
  c.zero = opt.zero == "0" || (opt.zero == "auto" && world.size() == 1) ? train::Zero::replicated : train::Zero::sharded;
  c.peak_tflops = opt.peak_tflops;
  c.step_mode = train::parse_train_graph(opt.cuda_graph);
  return c;
}

// The teacher's config where the stage needs one (cheap: no weight is read), checked against the
// student's.
std::optional<ModelConfig> read_teacher_config(const TrainOptions& opt, const train::StageTraits& stage,
                                          const ModelConfig& student) {
  train::check_teacher(stage.stage, !opt.teacher.empty());
  if (!stage.needs_teacher) return std::nullopt;
  const ModelConfig t = read_model_config(opt.teacher);
  HYDRA_USER_CHECK(t.vocab_size == student.vocab_size && t.hidden_size == student.hidden_size,
                   "teacher {} ({}) and student ({}) differ in vocabulary or hidden size", opt.teacher, t.summary(),
                   student.summary());
  HYDRA_USER_CHECK(!stage.teacher_layers_match || t.num_layers == student.num_layers,
                   "{} needs as many teacher layers as student layers: teacher {} has {}, the student {}", stage.name,
                   opt.teacher, t.num_layers, student.num_layers);
  return t;
}

// Every rank agrees on the run's inputs before any weight is read: the model's fields, the data's
// token counts and samples, the model's and teacher's contents; then the data's content identities
// (add_data_identities). Fills c.inputs, which --resume compares with the stored state.
void agree_on_inputs(App& app, const TrainOptions& opt, train::TrainConfig& c, const ModelConfig& student,
                     const std::optional<ModelConfig>& teacher, Device device) {
  RunFingerprint inputs;
  add_model_fields(inputs, student, device, storage_dtype(device));
  if (teacher) add_model_fields(inputs, "teacher", *teacher);
  // The data: each file's token count (cheap: the dataset's shape; the streams are read later).
  for (const std::string& f : c.data) inputs.add("training data tokens " + f, std::to_string(token_file_length(f)));
  for (const std::string& f : c.eval_data) {
    inputs.add("evaluation data tokens " + f, std::to_string(token_file_length(f)));
  }
  // The model's and teacher's contents (XXH3 of each file's bytes, runtime/content_hash.h): a rank with a stale
  // copy under the same path is named before the first collective, and --resume compares them with
  // the fingerprints stored in the training state. Every rank hashes its own copy (a model is read
  // whole anyway), once: the hash is cached by the file's stamp (runtime/token_identity.h).
  const auto fingerprint = [&](const std::string& role, const std::string& path) {
    c.inputs.push_back({role, path, hash_hex(cached_file_hash(path))});
    inputs.add("contents of the " + role + " " + path, c.inputs.back().hash);
  };
  if (opt.model.model_path.empty()) {
    c.inputs.push_back({"model", opt.model.describe(), opt.model.describe()});
  } else {
    fingerprint("model", opt.model.model_path);
  }
  if (teacher) fingerprint("teacher", opt.teacher);
  // The data: each rank checks its own copy cheaply (dataset types and lengths, 16 windows:
  // runtime/token_identity.h token_file_sample); rank 0 then gives every rank the content identity.
  std::vector<std::pair<std::string, std::string>> data_roles;  // role, path
  for (size_t i = 0; i < c.data.size(); ++i) data_roles.emplace_back(fmt::format("training data {}", i + 1), c.data[i]);
  for (size_t i = 0; i < c.eval_data.size(); ++i) data_roles.emplace_back(fmt::format("evaluation data {}", i + 1), c.eval_data[i]);
  for (const auto& [role, path] : data_roles) inputs.add("sample of the " + role + " " + path, token_file_sample(path));
  agree_on_run(app, inputs);
  for (size_t i = 0; i < data_roles.size(); ++i) {
    const bool training = i < c.data.size();
    const std::string& corpus = training ? c.data_corpora[i] : c.eval_corpora[i - c.data.size()];
    c.inputs.push_back({data_roles[i].first, data_roles[i].second, "", corpus});
  }
  add_data_identities(app.world, c.inputs, student.vocab_size, c.seq_len);
}

// The kept activations (--kept-activations: the most the memory plan fits on every rank, for
// auto) into c.kept, and the plan checked against the memory this rank can use; logged.
void plan_memory(App& app, const TrainOptions& opt, train::TrainConfig& c, SequenceGroups& topology,
                 const ModelConfig& student, const std::optional<ModelConfig>& teacher, DeviceWorld& world) {
  const train::StageTraits& stage = train::stage_traits(c.stage);
  const auto plan = [&](const KeptActivations& keep) {
    // A micro-batch's windows run packed as one sequence: batch_seqs · seq_len tokens over sp ranks.
    return estimate_training_memory(student, c.batch_seqs * c.seq_len / topology.sp(), topology.sp(),
                                    teacher ? &*teacher : nullptr, world.device,
                                    stage.objective == train::StageObjective::alignment, keep, true, DType::f32,
                                    c.zero == train::Zero::sharded ? topology.world().size() : 1);
  };
  const int64_t layers = student.num_layers;
  c.kept = choose_kept_activations(parse_kept_policy(opt.kept_activations), layers, plan, world.device,
                                   app.mpi.local_size(), *world.comm);
  const MemoryEstimate estimate = plan(c.kept);
  check_memory_plan(estimate, world.device, fmt::format("training at --seq-len {} on {} rank(s) per sequence", c.seq_len,
                                                        topology.sp()), app.mpi.local_size());
  if (c.step_mode == train::StepMode::graph) {
    // The step arena keeps every block a micro-batch allocates (runtime/step_arena.h): the pass's
    // allocations added up, in place of its peak.
    MemoryEstimate arena = estimate;
    arena.activations = std::max(estimate.activations, estimate.allocated);
    const double g = 1024.0 * 1024.0 * 1024.0;
    check_memory_plan(arena, world.device, fmt::format("--cuda-graph on (its step arena holds all {:.2f} GiB a "
                                                       "micro-batch allocates, not the {:.2f} GiB peak of an eager step)",
                                                       estimate.allocated / g, estimate.activations / g),
                      app.mpi.local_size(), "use --cuda-graph off, or fewer --batch-seqs (more --grad-accum)");
  }
  // The CPU path plans no device memory: no "0.0 GiB" plan.
  log::info("train: {}kept for the backward: GDN outputs {}, projection {}, MLP gate/up in {} of {} layers "
            "(--kept-activations {})", world.device == Device::cuda ? "memory plan " + estimate.describe() + " per rank; " : "",
            c.kept.gdn_outputs ? "yes" : "no", c.kept.projection ? "yes" : "no", c.kept.mlp_layers, layers,
            opt.kept_activations);
}

// The run's last lines (rank 0): the summary line, its JSON, and how to continue a stopped run.
void report_run(App& app, const TrainOptions& opt, const std::vector<std::string>& args, const train::TrainConfig& c,
            const SequenceGroups& topology, Device device, const train::TrainSummary& s) {
  if (app.world.rank() != 0) return;
  const bool gpu = device == Device::cuda;  // MFU is a GPU figure (--peak-tflops)
  log::info("train {}: steps {}..{} in {:.1f} s, final loss {:.4f}{}, {:.0f} tokens/s{}, peak memory {:.2f} GiB",
            opt.stage, s.first_step, s.last_step, s.seconds, s.last_loss,
            s.last_eval_loss ? fmt::format(", eval {} {:.4f}", s.eval_metric, *s.last_eval_loss) : "", s.tokens_per_s,
            gpu ? fmt::format(", MFU {:.1f}%", 100 * s.mfu) : "", s.peak_memory_gib);
  const nlohmann::json summary = {
      {"command", "train"},  {"stage", opt.stage},           {"model", opt.model.describe()},
      {"ranks", app.world.size()}, {"sp", topology.sp()},   {"device", device_flag_name(device)},
      {"zero", c.zero == train::Zero::sharded ? 1 : 0},
      {"seq_len", c.seq_len}, {"first_step", s.first_step},  {"last_step", s.last_step},
      {"loss", s.last_loss},
      {"eval_loss", s.last_eval_loss ? nlohmann::json(*s.last_eval_loss) : nlohmann::json()},
      {"eval_metric", s.last_eval_loss ? nlohmann::json(s.eval_metric) : nlohmann::json()},
      {"seconds", s.seconds}, {"tokens_per_s", s.tokens_per_s}, {"mfu", gpu ? nlohmann::json(s.mfu) : nlohmann::json()},
      {"peak_memory_gib", s.peak_memory_gib}, {"step_flops", s.step_flops}, {"lm_head_flops", s.lm_head_flops},
      {"out_dir", c.out_dir}, {"stopped", s.stopped}};
  std::cout << summary.dump() << std::endl;
  if (s.stopped) {
    log::warn("train: stopped by {} after step {}; saved {}. Continue with:\n  {}", s.stop_reason, s.last_step,
              s.checkpoint, resume_command(app.binary, args, app.world.size()));
  }
}

}  // namespace

int run_train(App& app, const std::vector<std::string>& args) {
  TrainOptions opt;
  po::options_description desc("hydra train");
  opt.bind(desc);
  if (!parse_command_line(app, "train",
                          "--stage pretrain|align|distill|finetune (--model STUDENT.h5 | --preset NAME) [--teacher TEACHER.h5] "
                          "--data CORPUS[:W][,MORE[:W]] --seq-len N --steps S --out-dir DIR [options]",
                          desc, args)) {
    return 0;
  }
  opt.validate();
  train::TrainConfig c = train_config(opt, app.world);
  // Cheap checks before any weight is read: configs, their compatibility, the inputs, the layout.
  const ModelConfig student_config = opt.model.config();
  const std::optional<ModelConfig> teacher_config = read_teacher_config(opt, train::stage_traits(c.stage), student_config);
  const Device device = resolve_device(opt.device, app.mpi, app.gpu_sharing);
  const std::string refusal = train::step_mode_refusal(c.step_mode, c.stage, opt.sp == 0 ? app.world.size() : opt.sp, device);
  HYDRA_USER_CHECK(refusal.empty(), "{}", refusal);
  agree_on_inputs(app, opt, c, student_config, teacher_config, device);
  DeviceWorld world = make_device_world(opt.device, app.mpi, app.world, app.gpu_sharing, opt.nccl_timeout);
  SequenceGroups topology(*world.comm, c.sp);
  check_sequence_length(student_config, c.seq_len, topology.sp());
  plan_memory(app, opt, c, topology, student_config, teacher_config, world);
  // The models: the student, and the teacher where the stage runs one in the same process.
  const DType dtype = storage_dtype(device);
  Model student = opt.model.build(world.device, dtype, app.kernels);
  std::optional<Model> teacher;
  if (teacher_config) {
    teacher.emplace(Model::load(opt.teacher, world.device, dtype,
                                opt.model.allow_nonfinite ? NonFinite::allow : NonFinite::refuse));
    teacher->set_kernel_options(app.kernels);
  }
  const train::TrainSummary s = train::run_training(c, topology, student, teacher ? &*teacher : nullptr);
  check_device_progress(world);
  report_run(app, opt, args, c, topology, world.device, s);
  // A stop on a signal is no error but not the end either: EX_TEMPFAIL, for scripts to resubmit.
  return s.stopped ? kExitStoppedBySignal : 0;
}

}  // namespace hydra
