// HDF5 NIAH eval sets: prebuilt samples for `hydra eval-niah --dataset FILE.h5`.
//
// The built-in generator (model/eval/niah.h) works in token space; real checkpoints are better judged on
// natural-language needles, which need a tokenizer. The tokenizer lives in Python
// (cluster/niah/build_niah_set.py, Hugging Face `tokenizers`); it writes this format and the C++
// side only reads it. write_eval_set stores built-in samples in the same format (tests, and sets
// to share). Format "hydrahead-niah-set", version 1 — samples are ragged, concatenated:
//   root attributes  format = "hydrahead-niah-set", format_version = 1 (int),
//                    task (string: the label of every cell, e.g. "single"),
//                    source (string, optional: what built it),
//                    item_separator (int, optional: the id between an answer's items, so recall
//                    counts each item present in the output in any order, niah.h answer_items;
//                    absent or −1: the answer is one item)
//   input_ids        [Σ T_i]  int32 or int64   all samples' token ids, one after the other
//   sample_offset    [N + 1]  int32 or int64   sample i is input_ids[sample_offset[i] : sample_offset[i+1]];
//                                              sample_offset[0] = 0, last = Σ T_i, increasing
//   answer_start     [N]      int             a_i: the answer is ids[a_i : a_i + answer_length[i]], a_i ≥ 1
//   answer_length    [N]      int             n_i ≥ 1, a_i + n_i ≤ T_i (the built-in tasks end with it)
//   length           [N]      int             the cell's length label (columns of the results table)
//   depth            [N]      int             the cell's depth label, percent 0..100 (rows)
//   sample_index     [N]      int, optional   index within the cell (default: running count per cell)
//   needle_position  [N]      int, optional   primary needle's first token (−1 or absent: unknown)
// "int" is int32 or int64. Cells are the distinct (length, depth) pairs in order of first appearance.
// Every id must be in [0, vocab) of the model that reads the set; T_i must suit the rank count.
#pragma once

#include <string>
#include <vector>

#include "model/eval/niah.h"

namespace hydra::niah {

inline constexpr const char* kEvalSetFormat = "hydrahead-niah-set";
inline constexpr int64_t kEvalSetVersion = 1;

struct EvalSet {
  std::string task;    // the cell label
  std::string source;  // informational
  int32_t item_separator = -1;  // the id between an answer's items (−1: one item)
  std::vector<Sample> samples;
};

// Writes atomically (temp + rename).
void write_eval_set(const std::string& path, const EvalSet& set);
// Reads and validates everything (ids against `vocab_size`, answer spans, offsets); UserErrors name
// the file, the dataset and the sample.
EvalSet read_eval_set(const std::string& path, int64_t vocab_size);

}  // namespace hydra::niah
