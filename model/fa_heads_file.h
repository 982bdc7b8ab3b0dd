// The FA head-set file: what head selection writes and `hydra convert --fa-heads file:PATH` reads.
//
// JSON:
//   {"format": "hydrahead-fa-heads", "version": 1,
//    "num_layers": L, "num_heads": H,
//    "fa_heads": [[h, ...], ...],                     // per layer, the heads that keep full attention
//    "scores": {"composite": [[s_0 .. s_{H-1}], ...], // optional, per layer and head; higher = keep
//               "total": ..., "direct": ..., "lm": ...},
//    "selection": {...}}                              // optional: how the heads were chosen (select-heads)
// Only fa_heads is required; `uniform:K`, `top-global:K` and `bottom-global:K` rank heads by the
// scores.composite of the file given as `--scores FILE`.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "model/config.h"

namespace hydra {

struct FaHeadsFile {
  std::vector<std::vector<int>> fa_heads;
  std::map<std::string, std::vector<std::vector<double>>> scores;  // name -> [L][H]
  std::string selection_json;  // optional JSON object, kept verbatim (informational; "" when absent)
};

// Reads and validates against the teacher shape (layer count, head indices, score dimensions).
FaHeadsFile read_fa_heads_file(const std::string& path, const ModelConfig& teacher);
void write_fa_heads_file(const std::string& path, const ModelConfig& teacher, const FaHeadsFile& file);

// --fa-heads SPEC, the heads that keep full attention ([layer] -> sorted heads):
//   uniform:K        K heads per layer: the K highest composite scores when `scores_path` is given,
//                    else the lowest indices;
//   random:K         K heads per layer drawn uniformly from (seed, layer): the per-layer control;
//   random-global:K[@DRAW]  K of the L*H heads drawn uniformly from the seed, or from DRAW when given
//                    (so the draw can vary apart from the new weights' seed); a layer may get several or none;
//   top-global:K     the K highest scores.composite of `scores_path` across all layers (ties: lower
//                    (layer, head) first); a layer may get none;
//   bottom-global:K  the K lowest, the same way;
//   layerwise:EVERY[@OFFSET]  layer l is all-FA when l % EVERY == OFFSET (default EVERY-1: layerwise:4
//                    is the 3:1 baseline, FA in layers 3, 7, ...), the rest all-GDN;
//   file:PATH        a head-set file.
// UserError naming the problem (also for --scores given to a kind that does not rank by score).
std::vector<std::vector<int>> resolve_fa_heads(const std::string& spec, const ModelConfig& teacher,
                                               const std::string& scores_path, uint64_t seed = 0);

}  // namespace hydra
