// Checkpoints written by every rank at once (DESIGN.md §4 "The training state"): a step folder
// holds one shard file per rank — that rank's flat range of the optimizer state (AdamW's own range:
// fp32 masters and both moments, in the accumulation dtype) — the model as a plain checkpoint, and
// a manifest written last, atomically, by rank 0 once every rank reported its shard done:
//
//   step-NNNNNN/shard-RRRRR-of-WWWWW.h5   rank R: datasets master, adam_m, adam_v [end − begin];
//                                         attributes format, rank, world_size, begin, end, trainable,
//                                         flat_layout, step, data_position
//   step-NNNNNN/model.h5                  rank 0: the weights every rank holds (fp32 on the CPU path,
//                                         the bf16 values on the GPU), a plain checkpoint for every
//                                         other command; no gathering
//   step-NNNNNN/manifest.json             rank 0, last: the run's identity (state.h's checks), the
//                                         data position and data_state, and per file its bytes and
//                                         XXH3 checksums (per dataset for shards, of the file for
//                                         model.h5), and each shard's write interval
//
// The folder is written as `.step-NNNNNN.tmp-PID` (rank 0's PID, the AtomicFile naming, so the
// sweep after a kill -9 finds it) and renamed once the manifest is in it; `latest` moves after.
// The ranks meet through host messages with the save's own, size-aware time limit
// (Communicator::gather_text), never in a collective under NCCL's watchdog while another writes.
// A shard that fails (a full disk) is reported to rank 0, which removes the folder, and every rank
// ends the run with the message; the previous checkpoint stays whole.
//
// Loading re-cuts the shards: a rank of any world size reads the shards overlapping its own range
// (every shard when replicated), verifying sizes and checksums first.
//
// Reading a manifest (someone may have edited it): every field is checked before it is used —
// present, of the kind written, numbers range-checked before any cast (runtime/json_integer.h:
// format_version 3.7, step 1e300 or 1.5 are refused naming the field), config a JSON object — and a
// shard's `file` must be the name its rank writes (shard-RRRRR-of-WWWWW.h5), a plain name inside
// the step folder (a link out of it is refused too): a manifest never makes hydra read another
// folder. Each shard dataset must be 1-D of its range's length, whatever its checksum says.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "model/train/optimizer.h"
#include "model/train/trainer.h"

namespace hydra::train {

// What a checkpoint says of its run: state.h5's attributes (an older, single-file state) or the
// manifest's fields. `version` 1–2: state.h5; 3: manifest.json with shards.
struct SavedRun {
  int64_t version = 0, step = 0, position = 0, world = 0, sp = 0, seq_len = 0, seed = 0;
  // The global batch (0 in states written before resharding): windows per step = batch_seqs × grad_accum × replicas.
  int64_t batch_seqs = 0, grad_accum = 0, replicas = 0;
  std::string stage, config;
  std::string data_state;  // data_state() as JSON text ("" in states written before it)
  nlohmann::json inputs;   // role → content fingerprint (version ≥ 2)
};

constexpr const char* kManifestName = "manifest.json";

// The save's time limit in seconds: 120 s plus the largest writer's bytes at 20 MB/s (a slow shared
// filesystem), unless `configured` > 0 (--save-timeout).
double save_time_limit(double configured, double largest_writer_bytes);

// Every rank: writes step `step` of `config.out_dir` as above and returns the step folder (on every
// rank). `data_position`: data_state() at `position`. Host messages with the save's limit; a
// failure on any rank is a UserError on every rank.
std::string write_sharded_checkpoint(const TrainConfig& config, SequenceGroups& topology, const Model& student,
                                     const AdamW& optimizer, int64_t step, int64_t position,
                                     const nlohmann::json& data_position);

// Whether `dir` is a step folder written by write_sharded_checkpoint (it holds a manifest).
bool has_manifest(const std::string& dir);
// The manifest of `dir`, parsed and checked (fields present, of their kinds and in range, shards
// under their writers' names covering the flat space once); a UserError naming it and the field otherwise.
SavedRun read_manifest(const std::string& dir);
// Loads the optimizer's state from the shards of `dir` (each rank the shards its range needs, their
// sizes and checksums verified, finite values, second moments ≥ 0). Collective when sharded.
void load_sharded_state(const std::string& dir, AdamW& optimizer);
// Reads every file the manifest of `dir` names and checks it (for newest_verified_checkpoint).
void verify_sharded_checkpoint(const std::string& dir);

}  // namespace hydra::train
