// Training data (DESIGN.md §4): one or more HDF5 token files, each a 1-D `input_ids` stream. Each
// file is cut into windows of seq_len + 1 tokens (a sequence and its next-token targets),
// consecutive windows overlapping by one token (stride seq_len), never crossing a file boundary.
// The windows of all files are visited in an order fixed by the seed: epoch e is a permutation of
// every window drawn from (seed, e), so window n of the run is a pure function of (seed, n) and the
// position in the data is one integer (part of the training state).
//
// A file's loss_mask, answer spans and document offsets (runtime/token_file.h) travel with its
// windows: a window's flags say which of its targets count and which are retrieval answers, and the
// document boundaries that fall inside it stay (the target that would cross one does not count; a
// window's first token starts its first, possibly partial, document).
//
// A micro-batch of windows is packed into one sequence (pack_windows): each window a document of its
// own (with the boundaries inside it), so it runs exactly as if alone (DESIGN.md §3.6) while the
// GPU sees one long sequence instead of one launch sequence per window.
//
// The streams are read whole into host memory at start (4 bytes per token per rank): fine for the
// fine-tuning and distillation sets this runtime trains on (a billion tokens is 4 GB); a larger
// corpus would read each window through an HDF5 hyperslab instead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/layout.h"
#include "runtime/token_file.h"

namespace hydra::train {

// One window: seq_len + 1 tokens and their flags (flag i belongs to the target token i).
struct Window {
  std::vector<int32_t> ids;      // [seq_len + 1]
  std::vector<uint8_t> counted;  // [seq_len + 1], or empty: every target counts (boundary crossings already 0)
  std::vector<uint8_t> answer;   // [seq_len + 1], or empty: no answers marked
  std::vector<int64_t> document_starts;  // 0 and the documents starting in (0, seq_len), or empty: one document
  TargetFlags flags() const { return {counted, answer}; }
};

// Windows packed into one sequence of Σ seq_len tokens (global order), ready for SequenceLayout::rows_of.
struct PackedBatch {
  std::vector<int32_t> ids, targets;   // targets −1 where not counted
  std::vector<uint8_t> answer;         // empty when no window marks answers
  std::vector<int64_t> document_starts;
  int64_t counted = 0;
};
PackedBatch pack_windows(const std::vector<Window>& windows);

class TokenWindows {
 public:
  // UserError when a file is unreadable, has ids outside [0, vocab) or holds no whole window.
  TokenWindows(const std::vector<std::string>& files, int64_t seq_len, uint64_t seed, int64_t vocab);

  int64_t seq_len() const { return seq_len_; }
  int64_t count() const { return static_cast<int64_t>(starts_.size()); }  // windows per epoch
  int64_t tokens() const;  // tokens in the files
  bool masked() const;     // some file has a loss_mask
  // The n-th window of the run (n ≥ 0): seq_len + 1 tokens.
  Window window(int64_t n) const;
  // The i-th window in file order (evaluation: the same windows every time).
  Window window_in_order(int64_t i) const;
  // Targets of window n of the run that count (seq_len without a mask): the step's global count,
  // which the gradient is divided by, is known on every rank before any forward runs.
  int64_t counted_targets(int64_t n) const;
  int64_t counted_targets_in_order(int64_t i) const;

 private:
  struct Start {
    int32_t file = 0;
    int64_t offset = 0;
    int64_t counted = 0;  // targets that count
  };
  int64_t index_in_epoch(int64_t epoch, int64_t i) const;
  int64_t seq_len_ = 0;
  uint64_t seed_ = 0;
  std::vector<TokenData> streams_;
  std::vector<Start> starts_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> order_;  // the permutation of cached_epoch_
};

}  // namespace hydra::train
