// The training driver behind `hydra train` (DESIGN.md §1.5): the four stages, AdamW, gradient
// accumulation with a token-weighted mean, evaluation, progress, resumable checkpoints.
//
// One code path for every world: the ranks are split into sequence-parallel groups of `sp` ranks
// (one sequence spread over a group, zigzag layout) and world/sp data-parallel replicas (each on
// its own windows). Every cross-rank step goes through SequenceGroups (parallel/sequence_groups.h): the gradient and loss
// reductions over the world (each rank's gradients hold only its tokens' contributions, so the sum
// over all ranks is the gradient of the global token-weighted mean), and the sequence group's
// communicator for the model's own collectives.
//
// The parts (DESIGN.md §1.5): stage.h (what each stage needs, trains, computes and logs), state.h
// (the output directory: step-NNNNNN/, `latest`, train.jsonl; the checks on --resume), shards.h
// (the step folder written by every rank: shards, model.h5, manifest; re-cut on load), evaluation.h (the held-out loss and NIAH accuracy, shared with eval-lm), and
// trainer.cpp (the run's preparation, the step loop, the evaluation/save/stop policies).
//
// --resume continues from `latest` and reproduces the losses of an uninterrupted run bit for bit on
// the CPU path. On the GPU a resumed run matches to the kernels' determinism: the attention backward adds
// dQ with fp32 atomics and the GDN backward accumulates some gradients with atomics, so the last
// bits of a step can differ between runs (every other reduction has a fixed order).
//
// Surviving a cluster (DESIGN.md §1.5 "Interruptions"): run_training holds a StopRequestScope
// (runtime/stop_request.h), so SIGTERM/SIGINT/SIGUSR1 only raise a flag; each rank adds it to the
// step's loss all-reduce, so all ranks see the same sum and stop after the same step, which is
// saved (every rank past the step's update) before the run returns with `stopped` set. --resume
// verifies the state (checksums, finite values, attributes in range) and compares the inputs'
// fingerprints with those stored (TrainConfig::inputs) unless allow_changed_inputs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/layer_buffers.h"
#include "model/train/optimizer.h"
#include "model/train/stage.h"
#include "parallel/communicator.h"
#include "parallel/sequence_groups.h"

namespace hydra::train {

// How a step runs its micro-batches (hydra train --cuda-graph; DESIGN.md §1.5 "The step as a CUDA
// graph"). eager: the kernels launched one by one (always so before; --cuda-graph off and auto).
// graph: the fixed step — every micro-batch's forward and backward inside one StepArena
// (runtime/step_arena.h: the same blocks every step), its token ids, targets and answer marks in
// persistent device buffers written before the step, the loss sums in device buffers, the gradient
// scale in a device scalar (objective.h DeviceLossHead) — captured as a CUDA graph after one warm-up
// step of the same shape and replayed; the reductions over the world, the gradient norm, the
// non-finite check and the update stay eager after it. fixed: the fixed step without the capture
// (any device): the graph's code path, what the CPU tests run. The graph needs the GPU, one rank per
// sequence (sp 1; data-parallel replicas are fine) and a cross-entropy stage (pretrain, finetune):
// train_graph_refusal says why not.
enum class StepMode { eager, fixed, graph };
// --cuda-graph on|off|auto → graph (on) or eager (off; auto: off — measured faster only for a small model: DESIGN.md §1.5).
StepMode parse_train_graph(std::string_view name);  // UserError for other values
// Why `mode` cannot run `stage` with sequence groups of `sp` ranks on `device` ("" when it can).
std::string step_mode_refusal(StepMode mode, Stage stage, int sp, Device device);

struct TrainConfig {
  Stage stage = Stage::pretrain;
  std::vector<std::string> data;       // token files (a corpus folder's shards, one by one)
  std::vector<std::string> eval_data;  // token files for the evaluation loss (optional)
  // Blend weights, one per file (−1: none given; all −1: the files pooled), and the corpus each file
  // belongs to (its folder or manifest as given; "": the file alone), model/train/data.h.
  std::vector<double> data_weights, eval_weights;
  std::vector<std::string> data_corpora, eval_corpora;
  int64_t seq_len = 0;
  int64_t steps = 0;        // the schedule's length (warmup, cosine decay)
  int64_t stop_at = 0;      // stop (and checkpoint) after this step; 0: --steps. For runs split over
                            // time-limited allocations: the schedule still spans `steps`.
  int64_t batch_seqs = 1;   // windows per micro-batch per replica (run one after the other)
  int64_t grad_accum = 1;   // micro-batches per step
  uint64_t seed = 0;        // data order
  int64_t save_every = 0;   // 0: only at the end (and at --stop-at); -1: never (benchmarks)
  int64_t eval_every = 0;   // 0: only at the end (when eval_data is given)
  int64_t eval_windows = 8;
  // NIAH accuracy at the training length at every evaluation (eval-niah's generator, fixed seed):
  // the tasks (empty: none) and samples per task, spread over depths 0..100.
  std::vector<std::string> eval_niah_tasks;
  int64_t eval_niah_samples = 32;
  int64_t keep = 2;         // step directories kept
  double save_timeout = 0;  // seconds a checkpoint's save may take (0: 120 s + the largest writer's bytes at 20 MB/s)
  TrainSet train = TrainSet::all;  // stage_traits(stage).trains unless the caller chooses
  OptimizerConfig optim;
  std::string out_dir;
  bool resume = false;
  int sp = 0;               // ranks per sequence (0: all ranks)
  Zero zero = Zero::sharded;  // optimizer state spread over the world (ZeRO-1) or on every rank
  double peak_tflops = 989; // dense bf16 peak for MFU (H100/H200 datasheet)
  KeptActivations kept;     // ForwardContext::keep (hydra train: what the memory plan fits)
  StepMode step_mode = StepMode::eager;  // --cuda-graph (StepMode above)
  // Content fingerprints of the inputs: stored in every state.h5; --resume refuses other values
  // (or another set of roles) unless allow_changed_inputs.
  struct Input {
    std::string role;  // "model", "teacher", "data 1", "eval data 1", ...
    std::string path;  // for messages
    std::string hash;  // the model and teacher: XXH3 of the file's bytes, hex (runtime/content_hash.h); a preset: its
                       // description; data: its content identity (runtime/token_identity.h)
    std::string corpus = {};  // data: the corpus it belongs to, as --data named it (for the log; not stored)
  };
  std::vector<Input> inputs;
  bool allow_changed_inputs = false;
};

struct TrainSummary {
  int64_t first_step = 1, last_step = 0;
  double last_loss = 0;
  std::optional<double> last_eval_loss;  // none without an evaluation loss
  std::string eval_metric;               // "cross_entropy", "kl" (distill) or "mse" (align)
  std::vector<std::pair<std::string, double>> last_niah_accuracy;  // (task, accuracy) at the last evaluation
  double seconds = 0, tokens_per_s = 0, mfu = 0;
  double step_flops = 0, lm_head_flops = 0;  // what MFU counts per step (all ranks), and its LM-head part
  double peak_memory_gib = 0;
  // Stopped on a signal before the last step: the checkpoint of last_step was written.
  bool stopped = false;
  std::string stop_reason;  // "SIGTERM" (the signal this rank received) or "a signal on another rank"
  std::string checkpoint;   // the newest step directory written by this run (empty: none)
  // The fixed step (StepMode fixed or graph): its arena's blocks and bytes (the sum of a micro-batch's
  // allocations), the fresh blocks each trained step of this run allocated (0: every block reused, the
  // condition of a capture) and the steps replayed from the captured graph.
  size_t arena_blocks = 0;
  double arena_bytes = 0;
  std::vector<size_t> fresh_blocks;
  int64_t graph_steps = 0;
};

// Runs the stage. `student` is the model trained (its weights are updated in place); `teacher`
// (the stages that need one: stage_traits) runs forward only. Collective over topology.world();
// rank 0 prints and writes.
TrainSummary run_training(const TrainConfig& config, SequenceGroups& topology, Model& student,
                          const Model* teacher);

}  // namespace hydra::train
