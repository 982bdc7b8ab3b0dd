// Outputs of head selection (`hydra select-heads`): the head-set JSON (model/fa_heads_file.h, what
// `hydra convert --fa-heads file:PATH` reads), its HDF5 copy for scripts and plots
// (cluster/heads/plot_heads.py), and the table printed at the end. Both files are written atomically.
//
// HDF5, format "hydrahead-head-scores", version 1:
//   root attributes  format, format_version = 1, model, num_layers, num_heads, budget (int),
//                    mode ("global" | "per_layer"), weights (JSON {"total","direct","lm"}),
//                    selection (JSON: the same object as the head-set file's "selection")
//   composite, total, direct, lm   [L, H] float32   scores (model/selection/head_selection.h defines them)
//   fa_mask                        [L, H] int32     1 where the head keeps full attention
//   all_but_one                    [L, H] float32   with group patching: every head of the layer but h patched
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/selection/head_selection.h"

namespace hydra::heads {

struct SelectionReport {
  std::string model;                       // what was scored (path or preset)
  ModelConfig config;
  Budget budget;
  ScoreWeights weights;
  HeadScores scores;
  CompositeScores composite;
  std::vector<std::vector<int>> fa_heads;  // per layer, sorted
  std::string selection_json;              // the "selection" object (inputs, normalisers, summary)
};

// The teacher's concentration (heads::concentration of the direct effect) and, when group patching
// ran, its group effects, as the JSON object select-heads puts into "selection":
//   "concentration": {"layer_share": [L], "top_share": {"1": s, "2": s, ...}, "effective_heads": e,
//                     "positive_direct": Σ max(direct, 0)}
//   "groups": {"layer_total": [L], "all_but_one": [L][H]}        (only with group patching)
nlohmann::ordered_json concentration_json(const HeadScores& scores);

void write_heads_json(const std::string& path, const SelectionReport& report);
void write_heads_h5(const std::string& path, const SelectionReport& report);
// Composite per layer (rows) and head (columns), FA heads starred, then the top heads' scores and the
// concentration (per-layer share, top-k share, effective heads; the group effects when measured).
std::string format_heads_table(const SelectionReport& report, int64_t top = 10);

}  // namespace hydra::heads
