// The training state on disk (DESIGN.md §4) and its I/O: the step directories of a run folder, the
// checks on --resume, the `latest` pointer and the log's truncation.
//
//   step-NNNNNN/           written by every rank at once (model/train/shards.h): one shard file per
//                          rank, model.h5, and manifest.json (the run's identity, the data
//                          position, sizes and checksums) written last by rank 0
//   latest                 the name of the newest complete step-NNNNNN, written last (atomically)
//   train.jsonl            one JSON line per step (and per evaluation)
// A step directory is written under a temporary name and renamed when complete, then `latest` is
// replaced; a crash at any point leaves the previous checkpoint and pointer intact.
// Older runs' step folders (model.h5 and one state.h5 holding the whole optimizer state by
// checkpoint names, with an XXH3 per dataset) still resume: read_verified_state below.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/train/data.h"
#include "model/train/shards.h"
#include "model/train/trainer.h"

namespace hydra::train {

// The step-NNNNNN directories of a run folder, oldest first (none if the folder cannot be read;
// symbolic links are not step folders).
std::vector<std::string> step_directories(const std::string& out_dir);

// Where a resumed run starts: after `step`, at data position `position`; the state's data_state
// ("" in states written before it) for check_data_state.
struct ResumePoint {
  int64_t step = 0, position = 0;
  std::string state_path, data_state;
};

// ---- The data's place in the training state, apart from the optimizer's ----
// state.h5 attribute `data_state` (JSON): the run's window position, the windows per epoch and, for
// a blend (model/train/data.h), each corpus's name ("path"), weight and windows drawn. --resume replays the
// blend's draws to the position and compares them: other weights or files would resume elsewhere.
// (The data's content identities are the attribute `inputs`, TrainConfig::Input.)
nlohmann::json data_state(const TokenWindows& data, int64_t position);
// UserError naming `path` when the blend's draws at `position` differ from the saved ones.
void check_data_state(const std::string& path, const std::string& saved, const TokenWindows& data, int64_t position);
// The realised share of each blended corpus over the first `position` windows (train.jsonl):
// {"web/": 0.70, "code/": 0.30}, keyed by the corpus as --data named it (a file alone: its path).
nlohmann::json data_shares(const TokenWindows& data, int64_t position);

// --resume: reads and verifies the state `latest` points to (a manifest and the shards this rank
// needs, or an older run's state.h5: checksums, finite values, attributes in range), checks that it
// belongs to this run (stage, windows per step — the world size and --sp may
// differ —, model config, seq_len, seed, the inputs' fingerprints unless allow_changed_inputs:
// UserErrors naming the difference) and loads the optimizer's state. `lead` (rank 0) prints the
// warnings.
ResumePoint load_checkpoint_dir(const TrainConfig& config, SequenceGroups& topology, const Model& student,
                                AdamW& optimizer, bool lead);

// Removes the temporary step directories of saves interrupted by a crash or kill -9 (their process
// gone); SIGTERM/SIGINT remove their own.
void remove_interrupted_saves(const std::string& out_dir);

// On --resume, the log keeps the steps up to the checkpoint: steps that ran after it (before the
// interruption) run again and are logged again, so each step appears once.
void truncate_log(const std::string& path, int64_t last_kept_step);

// The step directory `latest` points to (empty when there is none). `latest` must hold a step
// folder's plain name (is_step_dir_name) inside `out_dir`, not a link out of it: a UserError otherwise.
std::string latest_checkpoint(const std::string& out_dir);

// The newest step directory of `out_dir` whose state verifies (checksums, finite values,
// attributes in range), or empty. Reads every state it tries: for messages after a failure.
std::string newest_verified_checkpoint(const std::string& out_dir);

// "step-NNNNNN"
std::string step_dir_name(int64_t step);
// Whether `name` is a step folder's name: "step-" and six or more digits (what `latest` may hold).
bool is_step_dir_name(const std::string& name);

}  // namespace hydra::train
