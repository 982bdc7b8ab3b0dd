// The training driver (trainer.h): the run's preparation, its step loop and the policies around a
// step (evaluation, saving, stopping). What a stage needs and computes is stage.h's table, the
// evaluation is evaluation.h's (shared with eval-lm), the state on disk is state.h's.
#include "model/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include <nlohmann/json.hpp>

#include "model/cost.h"
#include "model/params.h"
#include "model/sequence_length.h"
#include "model/train/data.h"
#include "model/train/evaluation.h"
#include "model/train/fixed_step.h"
#include "model/train/objective.h"
#include "model/train/state.h"
#include "model/weight_layout.h"
#include "runtime/fault.h"
#include "runtime/host_memory.h"
#include "runtime/log.h"
#include "runtime/phase_timer.h"
#include "runtime/stop_request.h"
#include "runtime/token_identity.h"
#if HYDRA_CUDA
#include "runtime/cuda_memory.h"
#endif

namespace hydra::train {
namespace fs = std::filesystem;
namespace {

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

// The checks that need no data read: the stage's inputs, the counts, the window length's layout.
void check_config(const TrainConfig& config, SequenceGroups& topology, const Model& student, const Model* teacher) {
  const StageTraits& stage = stage_traits(config.stage);
  check_teacher(config.stage, teacher != nullptr);
  HYDRA_USER_CHECK(!stage.only_that_set || config.train == stage.trains,
                   "--stage {} trains only the {} (--train {})", stage.name,
                   stage.trains == TrainSet::attention ? "attention block" : "whole model",
                   stage.trains == TrainSet::attention ? "attention" : "all");
  HYDRA_USER_CHECK(config.steps >= 1 && config.batch_seqs >= 1 && config.grad_accum >= 1,
                   "--steps, --batch-seqs and --grad-accum must be at least 1");
  check_sequence_length(student.config(), config.seq_len, topology.sp());  // an admissible window length
  const std::string refusal = step_mode_refusal(config.step_mode, config.stage, topology.sp(), student.device());
  HYDRA_USER_CHECK(refusal.empty(), "{}", refusal);
}

// Waits for the work queued on this thread's stream (the fixed step's timing: it records no phase
// events, whose finish() would otherwise wait).
void wait_for_device(Device device) {
#if HYDRA_CUDA
  if (device == Device::cuda) {
    CudaEvent done;
    done.record(current_stream());
    done.synchronize();
  }
#endif
  (void)device;
}

// What one optimizer step produced (Trainer::train_step).
struct StepResult {
  int64_t step = 0, position = 0;  // the step and the data position after it
  LossSums total;  // over every rank and micro-batch
  double loss = 0, grad_norm = 0;
  StepStats stats;
  std::vector<double> phases;      // seconds per Phase (rank 0's); empty: not timed (the fixed step)
  bool graph = false;              // the micro-batches were replayed from a CUDA graph (the fixed step)
  size_t fresh_blocks = 0;         // tensor blocks the fixed step's micro-batches allocated
  std::vector<double> layer_mean;  // alignment: each layer's mean loss over the step's tokens
  int stop_votes = 0;              // ranks that received a stop signal (the same count on every rank)
  double seconds = 0;
};

// One run of run_training: the state the step loop and its policies share.
class Trainer {
 public:
  Trainer(const TrainConfig& config, SequenceGroups& topology, Model& student, const Model* teacher);
  TrainSummary run();

 private:
  void start();
  void describe() const;
  int64_t step_count(int64_t position) const;
  StageRun stage_run(PhaseTimer* timer) const {
    return StageRun{config_.stage, topology_.sequence(), student_, teacher_, config_.kept, timer};
  }
  void check_something_counts() const;
  void skip_step(int64_t step);
  StepResult train_step(int64_t step, int64_t counted);
  void check_counted(int64_t step, int64_t counted, const LossSums& total) const;
  void refuse_non_finite(int64_t step, const StepResult& r) const;
  void launch_step(int64_t step, int64_t counted);
  StepResult finish_step();
  bool finish_now(int64_t step) const;
  void complete(const StepResult& r);
  void log_step(int64_t step, const StepResult& r);
  void evaluate_if_due(int64_t step);
  bool save_or_stop(int64_t step, int stop_votes);
  void evaluate(int64_t step);
  void write_log_line(const nlohmann::json& line);

  const TrainConfig& config_;
  const StageTraits& stage_;
  SequenceGroups& topology_;
  Communicator& world_;
  Model& student_;
  const Model* teacher_;
  const bool lead_;
  const TokenWindows data_;
  std::optional<TokenWindows> eval_;
  StepWindows step_windows_;  // this rank's rows of data_'s windows, a step ahead (data.h)
  const NiahEvaluation niah_;
  AdamW optimizer_;
  PhaseTimer timer_;
  std::optional<FixedStep> fixed_;  // StepMode fixed or graph (trainer.h, fixed_step.h)
  // The fixed step in a world of one: the optimizer's tail runs on the device inside the step
  // (ops::DeviceUpdate; the graph captures it), its norm and guard read back with the loss sums.
  bool device_tail_ = false;
  // Fixed steps launched and not yet finished (at most two: fixed_step.h), oldest first.
  struct Launched {
    int64_t step = 0, counted = 0, position = 0;  // position: the data position after the step
    std::chrono::steady_clock::time_point t0;
  };
  std::deque<Launched> launched_;
  std::chrono::steady_clock::time_point last_finish_{};  // when the last finish_step() returned
  const int64_t per_replica_, replicas_, step_tokens_;
  int64_t first_step_ = 1, last_step_ = 0, position_ = 0;
  double step_flops_ = 0, lm_head_flops_ = 0, busy_s_ = 0;
  fs::path log_path_;
  std::ofstream jsonl_;
  TrainSummary summary_;
};

// The files of --data (role "training data") or --eval-data ("evaluation data") with their weights
// and content identities (TrainConfig::inputs, where known: the window index is then cached).
std::vector<DataSource> data_sources(const TrainConfig& config, const std::vector<std::string>& paths,
                                     const std::vector<double>& weights, const std::vector<std::string>& corpora,
                                     const std::string& role) {
  std::vector<DataSource> sources;
  for (size_t i = 0; i < paths.size(); ++i) {
    std::string identity;
    for (const TrainConfig::Input& in : config.inputs) {
      if (in.role == fmt::format("{} {}", role, i + 1) && in.hash.rfind("v", 0) == 0) identity = in.hash;
    }
    sources.push_back({paths[i], i < weights.size() ? weights[i] : -1.0, identity, i < corpora.size() ? corpora[i] : ""});
  }
  return sources;
}

// Rank 0 opens the files first: it builds each window index (one pass over a masked or documented
// file) and caches it under the content identity; the other ranks then read it from the cache
// instead of making the same pass at once on the same cores and disk.
TokenWindows rank0_first(Communicator& world, const std::function<TokenWindows()>& open) {
  std::optional<TokenWindows> w;
  if (world.rank() == 0) w.emplace(open());
  world.barrier();
  if (world.rank() != 0) w.emplace(open());
  return std::move(*w);
}

TokenWindows training_windows(const TrainConfig& config, Communicator& world, int64_t vocab) {
  return rank0_first(world, [&] {
    return TokenWindows(data_sources(config, config.data, config.data_weights, config.data_corpora, "training data"), config.seq_len,
                        config.seed, vocab);
  });
}

std::optional<TokenWindows> held_out_windows(const TrainConfig& config, Communicator& world, int64_t vocab) {
  if (config.eval_data.empty()) return std::nullopt;
  return rank0_first(world, [&] {  // each file in its own order
    return TokenWindows(data_sources(config, config.eval_data, config.eval_weights, config.eval_corpora, "evaluation data"), config.seq_len,
                        0, vocab, false);
  });
}

OptimizerConfig scheduled(OptimizerConfig optim, int64_t steps) {
  optim.total_steps = steps;
  return optim;
}

Trainer::Trainer(const TrainConfig& config, SequenceGroups& topology, Model& student, const Model* teacher)
    : config_(config),
      stage_(stage_traits(config.stage)),
      topology_(topology),
      world_(topology.world()),
      student_(student),
      teacher_(teacher),
      lead_(topology.world().rank() == 0),
      data_(training_windows(config, topology.world(), student.config().vocab_size)),
      eval_(held_out_windows(config, topology.world(), student.config().vocab_size)),
      step_windows_(data_, {.batch_seqs = config.batch_seqs, .grad_accum = config.grad_accum,
                            .replicas = topology.replicas(), .replica = topology.replica(), .sp = topology.sp(),
                            .sp_rank = topology.sequence().rank()}),
      niah_(niah_evaluation(config.eval_niah_tasks, student.config().vocab_size, config.seq_len, config.eval_niah_samples)),
      optimizer_(student, scheduled(config.optim, config.steps),
                 [&config](const std::string& name) {
                   return config.train == TrainSet::all || param_traits(name).attention_block;
                 },
                 &topology.world(), config.zero),
      timer_(student.device()),
      per_replica_(config.batch_seqs * config.grad_accum),
      replicas_(topology.replicas()),
      step_tokens_(per_replica_ * replicas_ * config.seq_len),
      log_path_(fs::path(config.out_dir) / "train.jsonl") {
  if (config.step_mode != StepMode::eager) {
    // This rank's rows of a micro-batch: batch_seqs windows of seq_len over the sequence group (sp 1 for the graph).
    fixed_.emplace(config.step_mode, student, config.grad_accum, config.batch_seqs * config.seq_len / topology.sp());
    device_tail_ = optimizer_.device_update_possible();
  }
}

// Resume or start fresh, take over the output directory, open the log.
void Trainer::start() {
  if (config_.resume) {
    const ResumePoint at = load_checkpoint_dir(config_, topology_, student_, optimizer_, lead_);
    first_step_ = at.step + 1;
    position_ = at.position;
    if (!at.data_state.empty()) check_data_state(at.state_path, at.data_state, data_, position_);
    HYDRA_USER_CHECK(first_step_ <= config_.steps, "--resume: the checkpoint is at step {}, --steps is {}: nothing to do",
                     at.step, config_.steps);
  } else {
    HYDRA_USER_CHECK(latest_checkpoint(config_.out_dir).empty(),
                     "{} already holds a training run (latest: {}); pass --resume to continue it or choose another "
                     "--out-dir", config_.out_dir, latest_checkpoint(config_.out_dir));
    // Step folders without `latest` (a pointer deleted, or lost with the run's log): another run's
    // checkpoints, which a fresh run would replace one by one.
    const std::vector<std::string> steps = step_directories(config_.out_dir);
    HYDRA_USER_CHECK(steps.empty(), "{} holds step folders of another run ({}{}) without a 'latest' pointer: a fresh run "
                     "would replace them; choose another --out-dir (or point 'latest' at the newest and pass --resume)",
                     config_.out_dir, fs::path(steps.empty() ? "" : steps.front()).filename().string(),
                     steps.size() > 1 ? fmt::format(" .. {}", fs::path(steps.back()).filename().string()) : "");
    // A log without a checkpoint (a run with --save-every -1, or one that failed before its first
    // save): a fresh run never appends to another run's steps.
    std::error_code ec;
    HYDRA_USER_CHECK(fs::file_size(log_path_, ec) == 0 || ec,
                     "{} holds the train.jsonl of another run (without a checkpoint); remove it or choose another "
                     "--out-dir", config_.out_dir);
  }
  // The windows of one step must be distinct windows of the data.
  const int64_t windows_per_step = per_replica_ * replicas_;
  HYDRA_USER_CHECK(windows_per_step <= data_.count(),
                   "a step takes {} windows (--batch-seqs {} × --grad-accum {} × {} replica(s)), the data holds {} of "
                   "{} tokens: a step would train on the same window twice; lower --batch-seqs/--grad-accum or add data",
                   windows_per_step, config_.batch_seqs, config_.grad_accum, replicas_, data_.count(),
                   config_.seq_len + 1);
  last_step_ = config_.stop_at > 0 ? std::min(config_.stop_at, config_.steps) : config_.steps;
  HYDRA_USER_CHECK(last_step_ >= first_step_, "--stop-at {} is before the first step of this run ({})", config_.stop_at,
                   first_step_);
  check_something_counts();
  // Every rank has checked the folder before rank 0 writes to it: a skipped first step logs at once,
  // with no collective before it, and another rank would then find "another run's" train.jsonl.
  world_.barrier();
  if (lead_) {
    std::error_code ec;
    fs::create_directories(config_.out_dir, ec);
    HYDRA_USER_CHECK(!ec, "--out-dir {} cannot be created: {}", config_.out_dir, ec.message());
    remove_interrupted_saves(config_.out_dir);
    if (config_.resume) truncate_log(log_path_.string(), first_step_ - 1);
  }
  if (lead_) {
    jsonl_.open(log_path_, std::ios::app);
    HYDRA_USER_CHECK(jsonl_.is_open(), "cannot open {} for writing", log_path_.string());
  }
  // Model FLOPs: 3 × the student's forward, the LM head included where the loss reads logits.
  const LogitHead head = stage_.lm_head ? LogitHead::every_position : LogitHead::none;
  const FlopCount window_flops = training_forward_flops(student_.config(), config_.seq_len, head);
  const double windows = static_cast<double>(per_replica_ * replicas_);
  step_flops_ = 3.0 * window_flops.total() * windows;
  lm_head_flops_ = 3.0 * window_flops.logits * windows;
}

// The run's shape on rank 0's console.
void Trainer::describe() const {
  if (!lead_) return;
  if (!stage_.loss_masks && data_.masked()) {
    log::warn("train {}: the data's loss_mask is ignored: alignment matches the layer outputs at every position", stage_.name);
  }
  const ModelConfig& mc = student_.config();
  log::info("train {}: {} steps of {} tokens ({} window(s) of {} × {} replica(s) × {} accumulation), {} rank(s) "
            "(sequence groups of {}), {} of {} parameters trained, data {} windows ({} tokens){}",
            stage_.name, config_.steps, step_tokens_, config_.batch_seqs, config_.seq_len, replicas_, config_.grad_accum,
            world_.size(), topology_.sp(), optimizer_.trainable_parameters(), parameter_count(mc), data_.count(),
            data_.tokens(), config_.resume ? fmt::format(", resumed at step {}", first_step_) : "");
  if (student_.device() == Device::cuda) {  // the CPU path has no meaningful peak: no MFU
    log::info("MFU counts {:.1f} TFLOP a step (3 × forward: layers {:.1f}, LM head {:.1f}) against {} TFLOP/s per rank",
              step_flops_ / 1e12, (step_flops_ - lm_head_flops_) / 1e12, lm_head_flops_ / 1e12, config_.peak_tflops);
  }
}

// The gradient is the mean over the step's counted targets (DESIGN.md §1.5): every rank holds the
// windows' counted targets (data.h's index), so each computes the step's global count itself,
// before any forward.
// Targets that cross a document boundary never count, mask or not (data.h counted_targets); a stage
// without loss masks (alignment) counts every position.
int64_t Trainer::step_count(int64_t position) const {
  if (!stage_.loss_masks) return step_tokens_;
  int64_t n = 0;
  for (int64_t w = 0; w < per_replica_ * replicas_; ++w) n += data_.counted_targets(position + w);
  return n;
}

// A run where nothing counts would log loss 0 (or skip every step and save nothing worth having):
// the steps of this run, and the held-out windows, must count at least one target (loss_mask, and
// documents longer than one token). Stops at the first that counts: cheap for any usable data.
void Trainer::check_something_counts() const {
  if (!stage_.loss_masks) return;
  bool any = false;
  for (int64_t step = first_step_, at = position_; step <= last_step_ && !any; ++step, at += per_replica_ * replicas_) {
    any = step_count(at) > 0;
  }
  HYDRA_USER_CHECK(any, "no target counts in the windows of steps {}..{} (the data's loss_mask is 0 there, or its "
                   "documents are 1 token long): nothing to train on", first_step_, last_step_);
  if (!eval_) return;
  const int64_t n = std::min(config_.eval_windows, eval_->count());
  any = false;
  for (int64_t i = 0; i < n && !any; ++i) any = eval_->counted_targets_in_order(i) > 0;
  HYDRA_USER_CHECK(any, "--eval-data: no target counts in its first {} window(s) (loss_mask 0, or documents 1 token "
                   "long): the held-out loss would be undefined", n);
}

// A line of train.jsonl (rank 0); a failed write (a full disk) ends the run with a UserError.
void Trainer::write_log_line(const nlohmann::json& line) {
  jsonl_ << line.dump() << std::endl;  // flushed: the file is complete after each line
  HYDRA_USER_CHECK(jsonl_.good(), "writing {} failed (disk full or over a file size limit?)", log_path_.string());
}

// A step whose windows count no target: nothing to learn from — no forward, no update, no division by zero.
void Trainer::skip_step(int64_t step) {
  if (lead_) {
    log::warn("step {}: no target of its {} window(s) is counted (loss_mask); skipped without an update", step,
              per_replica_ * replicas_);
    write_log_line(nlohmann::json{{"type", "step"}, {"step", step}, {"loss", nullptr}, {"counted_tokens", 0},
                                  {"skipped", "no counted target"}, {"data_position", position_ + per_replica_ * replicas_}});
  }
  position_ += per_replica_ * replicas_;
  summary_.last_step = step;
}

// The step's micro-batches (forward and backward), the reductions over the world and the update.
// The fixed step: launch_step() then finish_step().
StepResult Trainer::train_step(int64_t step, int64_t counted) {
  if (fixed_) {
    launch_step(step, counted);
    return finish_step();
  }
  const auto t0 = std::chrono::steady_clock::now();
  const double grad_scale = 1.0 / static_cast<double>(counted);
  const StageRun run = stage_run(&timer_);
  LossSums local;
  std::vector<double> layer_loss;
  StepResult r;
  r.step = step;
  // Micro-batch m of this replica: windows j = m·batch_seqs … (m+1)·batch_seqs − 1, window j at
  // data position + j·replicas + replica (the order is the same as one window at a time), each
  // holding this rank's rows; the next step's are read meanwhile (data.h StepWindows).
  const int64_t next = step < last_step_ ? position_ + per_replica_ * replicas_ : -1;
  for (const std::vector<Window>& batch : step_windows_.take(position_, next)) {
    local += stage_loss(run, batch, grad_scale, &optimizer_.grads(), &layer_loss);
  }
  position_ += per_replica_ * replicas_;
  r.position = position_;
  optimizer_.reduce_gradients();  // all-reduced (--zero 0) or reduce-scattered into the owners (--zero 1)
  r.total = reduce_loss_sums(world_, local, &r.stop_votes);
  check_counted(step, counted, r.total);
  r.loss = mean_loss(r.total);
  r.grad_norm = optimizer_.grad_norm();
  refuse_non_finite(step, r);
  r.stats = optimizer_.step(step, r.grad_norm);
  // The next step's gradients start from zero, queued behind the update (one launch on the GPU).
  optimizer_.zero_grads();
  const auto phases = timer_.finish();  // waits for the step's work (the update included)
  r.phases.assign(phases.begin(), phases.end());
  if (stage_.logs_layer_loss) {
    const int64_t layers = student_.config().num_layers;
    Tensor buf = Tensor::zeros({layers}, DType::f64);
    for (size_t l = 0; l < layer_loss.size(); ++l) buf.data_as<double>()[l] = layer_loss[l];
    all_reduce_sum_host(world_, buf);
    for (int64_t l = 0; l < layers; ++l) r.layer_mean.push_back(buf.data_as<double>()[l] / static_cast<double>(r.total.tokens));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// The windows read count what the window index said they would (data.h): an index that does not
// match the data (a cache entry written by something other than hydra, with a valid checksum) is
// named rather than trained on.
void Trainer::check_counted(int64_t step, int64_t counted, const LossSums& total) const {
  HYDRA_USER_CHECK(!stage_.loss_masks || total.tokens == counted || !data_.index_from_cache(),
                   "step {}: its windows count {} targets, the cached window index of the data says {}: the cache "
                   "entry does not match the data (remove {}/token-index and start again)", step, total.tokens,
                   counted, token_identity_cache_dir());
  HYDRA_ASSERT(!stage_.loss_masks || total.tokens == counted, "step {}: {} targets counted, {} expected", step,
               total.tokens, counted);
}

// A step whose loss or gradient norm is not finite is not applied: the run stops with the last good
// checkpoint named (the device tail skipped its update already: the same weights are left).
void Trainer::refuse_non_finite(int64_t step, const StepResult& r) const {
  if (std::isfinite(r.loss) && std::isfinite(r.grad_norm)) return;
  // The newest checkpoint whose state verifies (rank 0 reads them; the others name `latest`).
  const std::string last = lead_ ? newest_verified_checkpoint(config_.out_dir) : latest_checkpoint(config_.out_dir);
  HYDRA_USER_FAIL("step {}: the loss is {} (gradient norm {}); stopped before applying the update. The last good "
                  "checkpoint is {} (continue from it with --resume, e.g. with a lower --lr)", step, r.loss, r.grad_norm,
                  last.empty() ? "none: no checkpoint was written yet" : last);
}

// The fixed step's first half: its inputs, its work (the graph) and, with the device tail, its
// update queued; nothing waits. The step is finished by finish_step(), at once or one step late.
void Trainer::launch_step(int64_t step, int64_t counted) {
  const auto t0 = std::chrono::steady_clock::now();
  const StageRun run = stage_run(nullptr);  // the fixed step records no phases (a capture cannot time them)
  const int64_t next = step < last_step_ ? position_ + per_replica_ * replicas_ : -1;
  std::vector<StageBatch> batches;
  for (const std::vector<Window>& batch : step_windows_.take(position_, next)) batches.push_back(stage_batch(run, batch));
  if (device_tail_) optimizer_.schedule_device_step(step);  // queued before the step's work
  const FixedStep::Tail tail = [this](const TensorView& sums, const TensorView& result) {
    optimizer_.queue_device_step(sums, result);
  };
  fixed_->launch(run, batches, counted, optimizer_.grads(), device_tail_ ? tail : FixedStep::Tail{});
  position_ += per_replica_ * replicas_;
  launched_.push_back({step, counted, position_, t0});
}

// The fixed step's second half for the oldest launched step: its results read (waiting for its
// work), checked and, without the device tail, the reduction and the update.
StepResult Trainer::finish_step() {
  HYDRA_ASSERT(!launched_.empty(), "finish_step() without a launched step");
  const Launched l = launched_.front();
  launched_.pop_front();
  const FixedStep::Collected c = fixed_->collect();
  StepResult r;
  r.step = l.step;
  r.position = l.position;
  r.graph = c.graph;
  r.fresh_blocks = c.fresh_blocks;
  // The device tail has queued the norm, the guard, the update and the zeroing already (a world of
  // one: nothing to reduce); collect() has read its result with the loss sums.
  if (!device_tail_) optimizer_.reduce_gradients();
  r.total = reduce_loss_sums(world_, c.sums, &r.stop_votes);
  check_counted(l.step, l.counted, r.total);
  r.loss = mean_loss(r.total);
  r.grad_norm = device_tail_ ? c.tail_result[ops::DeviceUpdate::kNorm] : optimizer_.grad_norm();
  const bool skipped = device_tail_ && c.tail_result[ops::DeviceUpdate::kSkipped] != 0;
  // The device guard skips exactly the steps refused here (the same sums, the same norm).
  HYDRA_ASSERT(skipped == (device_tail_ && (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm))),
               "step {}: the device update's guard ({}) disagrees with the host's check (loss {}, norm {})", l.step,
               skipped ? "skipped" : "applied", r.loss, r.grad_norm);
  refuse_non_finite(l.step, r);
  if (device_tail_) {
    r.stats = optimizer_.stats(l.step, r.grad_norm);  // what the device applied (the same arithmetic)
  } else {
    r.stats = optimizer_.step(l.step, r.grad_norm);
    optimizer_.zero_grads();
    wait_for_device(student_.device());  // the update: no phase events to wait on
  }
  // A step's time: from its launch, or from the end of the step before it where that came later
  // (steps launched one ahead overlap; their times then add up to the wall time of the run's steps).
  const auto end = std::chrono::steady_clock::now();
  r.seconds = std::chrono::duration<double>(end - std::max(l.t0, last_finish_)).count();
  last_finish_ = end;
  return r;
}

// Whether step `step` must be finished before the loop goes on (rather than one step late): an
// evaluation or a save after it reads the weights and the state, which must hold this step's update
// and nothing after it; a stop asked for is taken at this step.
bool Trainer::finish_now(int64_t step) const {
  const bool eval = (config_.eval_every > 0 && step % config_.eval_every == 0) || step == last_step_;
  const bool save = config_.save_every > 0 && step % config_.save_every == 0;
  return eval || save || step == last_step_ || stop_signal() != 0;
}

// What the loop does with a finished step: the summary, the log lines.
void Trainer::complete(const StepResult& r) {
  busy_s_ += r.seconds;
  if (fixed_) {
    summary_.fresh_blocks.push_back(r.fresh_blocks);
    summary_.graph_steps += r.graph ? 1 : 0;
    if (lead_ && r.step == first_step_) {
      log::info("fixed step: the arena holds {:.3f} GiB in {} blocks (the sum of a micro-batch's allocations){}{}",
                fixed_->arena_bytes() / (1024.0 * 1024.0 * 1024.0), fixed_->arena_blocks(),
                config_.step_mode == StepMode::graph ? "; the next step of the same shape is captured as a CUDA graph" : "",
                device_tail_ ? "; the update runs on the device, each step's results read one step late" : "");
    }
  }
  summary_.last_step = r.step;
  summary_.last_loss = r.loss;
  log_step(r.step, r);
}

// The step's console line and train.jsonl line (rank 0).
void Trainer::log_step(int64_t step, const StepResult& r) {
  const int64_t done = step - first_step_ + 1;
  const double tokens_per_s = static_cast<double>(step_tokens_) / r.seconds;
  const double mfu = step_flops_ / r.seconds / (static_cast<double>(world_.size()) * config_.peak_tflops * 1e12);
  if (!lead_) return;
  auto phase = [&](Phase p) { return r.phases[static_cast<size_t>(p)]; };
  const std::string phases =
      r.phases.empty()
          ? std::string(r.graph ? "[CUDA graph: phases not timed]" : "[fixed step: phases not timed]")
          : fmt::format("[gemm {:.2f} fa {:.2f} gdn {:.2f} comm {:.2f} other {:.2f} s]", phase(Phase::gemm),
                        phase(Phase::fa), phase(Phase::gdn), phase(Phase::comm), phase(Phase::other));
  log::info("step {}/{}  loss {:.4f}  lr {:.2e}  grad-norm {:.3f}{}  {:.0f} tok/s  {:.2f} s/step  ETA {}  {}", step,
            config_.steps, r.loss, r.stats.lr, r.grad_norm, r.stats.clip_scale < 1 ? " (clipped)" : "", tokens_per_s,
            r.seconds, format_duration(busy_s_ / static_cast<double>(done) * static_cast<double>(last_step_ - step)),
            phases);
  nlohmann::json line{{"type", "step"}, {"step", step}, {"loss", r.loss}, {"lr", r.stats.lr}, {"grad_norm", r.grad_norm},
                      {"clip_scale", r.stats.clip_scale}, {"tokens", step_tokens_}, {"step_s", r.seconds},
                      {"tokens_per_s", tokens_per_s},
                      {"mfu", student_.device() == Device::cuda ? nlohmann::json(mfu) : nlohmann::json()},  // a GPU figure
                      {"data_position", r.position}};
  if (stage_.logs_answer_split) line.update(loss_fields(r.total, ""));
  if (data_.blended()) line["data_shares"] = data_shares(data_, r.position);  // realised, over the run so far
  // Seconds per phase of the layers (forward, recompute, backward) on rank 0; the loss head and the
  // optimizer are the rest of step_s. Concurrent FA/GDN branches overlap, so phases can sum past it.
  // The fixed step: no phases (null), whether the graph was replayed, the fresh arena blocks.
  nlohmann::json phase_s;
  for (size_t i = 0; i < r.phases.size(); ++i) phase_s[phase_name(static_cast<Phase>(i))] = r.phases[i];
  line["phases"] = phase_s;
  if (fixed_) line.update({{"cuda_graph", r.graph}, {"fresh_blocks", r.fresh_blocks}});
  if (!r.layer_mean.empty()) line["layer_loss"] = r.layer_mean;
  write_log_line(line);
}

void Trainer::evaluate_if_due(int64_t step) {
  if ((config_.eval_every > 0 && step % config_.eval_every == 0) || step == last_step_) evaluate(step);
}

// The save when due. Returns true when the run stops here (a stop signal on some rank: this step is
// saved whatever --save-every says).
bool Trainer::save_or_stop(int64_t step, int stop_votes) {
  // Saves: every --save-every steps, at the end (unless -1), and always at --stop-at (to resume from).
  const bool periodic = config_.save_every > 0 && step % config_.save_every == 0;
  const bool last = step == last_step_ && (config_.save_every >= 0 || last_step_ < config_.steps);
  const bool stop = stop_votes > 0 && step < last_step_;
  if (periodic || last || stop) {
    // Every rank writes its shard at once; the ranks meet through host messages with the save's
    // own limit, so none waits in a collective while another writes (shards.h).
    summary_.checkpoint = write_sharded_checkpoint(config_, topology_, student_, optimizer_, step, position_,
                                                   data_state(data_, position_));
  }
  if (stop) {
    summary_.stopped = true;
    summary_.checkpoint = (fs::path(config_.out_dir) / step_dir_name(step)).string();
    summary_.stop_reason = stop_signal() != 0 ? signal_name(stop_signal()) : "a signal on another rank";
  }
  return stop;
}

// The held-out loss (--eval-data: the stage's metric over the first --eval-windows windows, packed
// --batch-seqs at a time as in training, each replica its share) and the NIAH accuracy (--eval-niah:
// the replicas split the samples); one "eval" line in train.jsonl.
void Trainer::evaluate(int64_t step) {
  if (!eval_ && niah_.tasks.empty()) return;
  nlohmann::json line{{"type", "eval"}, {"step", step}};
  if (eval_) {
    const int64_t n = std::min(config_.eval_windows, eval_->count());
    const HeldOutShare share{.windows = n, .batch_seqs = config_.batch_seqs, .replica = topology_.replica(),
                             .replicas = static_cast<int>(replicas_)};
    const LossSums total = held_out_loss(stage_run(nullptr), world_, *eval_, share);  // untimed: the phases are the step's
    summary_.last_eval_loss = mean_loss(total);
    summary_.eval_metric = stage_.eval_metric;
    line.update({{"eval_loss", *summary_.last_eval_loss}, {"eval_metric", stage_.eval_metric}, {"windows", n}});
    if (stage_.logs_answer_split) line.update(loss_fields(total, "eval_"));
    if (lead_) {
      log::info("eval after step {}: {} {:.4f} over {} windows{}", step, stage_.eval_metric, *summary_.last_eval_loss, n,
                total.answer_tokens > 0 ? fmt::format(" (answers {:.4f} over {} targets)",
                                                      total.answer_loss / static_cast<double>(total.answer_tokens),
                                                      total.answer_tokens)
                                        : "");
    }
  }
  if (!niah_.tasks.empty()) {
    summary_.last_niah_accuracy.clear();
    std::string text;
    for (const NiahScore& s : niah_scores(student_, topology_, niah_)) {
      summary_.last_niah_accuracy.emplace_back(s.task, s.accuracy);
      line["niah_" + s.task] = s.accuracy;
      line["niah_" + s.task + "_logprob"] = s.mean_logprob;
      text += fmt::format(" {} {:.3f}", s.task, s.accuracy);
    }
    line["niah_samples"] = niah_.samples;
    if (lead_) log::info("eval after step {}: NIAH accuracy at {} tokens ({} samples each):{}", step, config_.seq_len,
                         niah_.samples, text);
  }
  if (lead_) write_log_line(line);
}

TrainSummary Trainer::run() {
  start();
  describe();
  summary_.first_step = first_step_;
  const auto started = std::chrono::steady_clock::now();
  optimizer_.zero_grads();  // and again after each step's update, for the next step (train_step)
  for (int64_t step = first_step_; step <= last_step_; ++step) {
    maybe_inject_fault("step");
    const int64_t counted = step_count(position_);
    if (counted == 0) {
      while (!launched_.empty()) complete(finish_step());  // the steps before it are logged first
      skip_step(step);
      evaluate_if_due(step);
      if (save_or_stop(step, 0)) break;  // a skipped step saves as any other (the run's last one too)
      continue;
    }
    StepResult r;
    if (fixed_ && device_tail_) {
      // One step late: step s is launched before step s − 1 is read, so the host prepares s while the
      // GPU runs s − 1 (the two read slots of fixed_step.h). A step whose evaluation, save or stop is
      // due is read at once (finish_now), so those never see a step that has not been checked.
      launch_step(step, counted);
      if (launched_.size() == 2) complete(finish_step());
      if (!finish_now(step)) continue;
      r = finish_step();
    } else {
      r = train_step(step, counted);
    }
    complete(r);
    evaluate_if_due(step);
    if (save_or_stop(step, r.stop_votes)) break;
  }
  HYDRA_ASSERT(launched_.empty(), "{} step(s) launched and never finished", launched_.size());
  summary_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const int64_t steps_done = summary_.last_step - first_step_ + 1;
  summary_.tokens_per_s = static_cast<double>(step_tokens_ * steps_done) / busy_s_;
  summary_.mfu = step_flops_ * static_cast<double>(steps_done) / busy_s_ /
                 (static_cast<double>(world_.size()) * config_.peak_tflops * 1e12);
  summary_.peak_memory_gib = peak_memory_gib(student_.device());
  summary_.step_flops = step_flops_;
  if (fixed_) {
    summary_.arena_blocks = fixed_->arena_blocks();
    summary_.arena_bytes = fixed_->arena_bytes();
  }
  summary_.lm_head_flops = lm_head_flops_;
  return summary_;
}

}  // namespace

StepMode parse_train_graph(std::string_view name) {
  if (name == "on") return StepMode::graph;
  if (name == "off" || name == "auto") return StepMode::eager;  // auto: off (measured for a small model only: DESIGN.md §1.5)
  HYDRA_USER_FAIL("--cuda-graph must be on, off or auto (got '{}')", name);
}

std::string step_mode_refusal(StepMode mode, Stage stage, int sp, Device device) {
  if (mode == StepMode::eager) return "";
  const char* what = mode == StepMode::graph ? "--cuda-graph on" : "the fixed step";
  if (mode == StepMode::graph && device != Device::cuda) {
    return fmt::format("{} replays the training step as a CUDA graph: it needs --device cuda (this run: {})", what,
                       device_name(device));
  }
  if (stage_traits(stage).objective != StageObjective::cross_entropy) {
    return fmt::format("{} applies to the cross-entropy stages (pretrain, finetune), not --stage {} (its teacher's "
                       "forward and its loss head are not captured)", what, stage_name(stage));
  }
  if (sp != 1) {
    return fmt::format("{} needs one rank per sequence (--sp 1; data-parallel replicas are fine), not sequence groups "
                       "of {} ranks (their exchanges run on the host between kernels)", what, sp);
  }
  return "";
}

TrainSummary run_training(const TrainConfig& config, SequenceGroups& topology, Model& student, const Model* teacher) {
  check_config(config, topology, student, teacher);
  // From here on SIGTERM/SIGINT/SIGUSR1 ask for a stop after the current step (runtime/stop_request.h).
  const StopRequestScope stop_scope;
  Trainer trainer(config, topology, student, teacher);
  return trainer.run();
}

}  // namespace hydra::train
