// The sequence-parallel layout (DESIGN.md §3.1): which tokens each rank owns, at which global positions.
//
// P > 1 ranks: zigzag. The sequence is cut into 2P equal segments; rank r owns segments r and
// 2P−1−r, stored one after the other in its local tensors ([T/P, ...] rows). Pairing an early and a
// late segment gives every rank the same amount of causal attention work. Lengths not divisible by
// 2P are refused with a message suggesting admissible ones (no silent padding).
// P = 1: one segment covering the whole sequence, so a single process takes any length.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/tensor.h"

namespace hydra {

// A rank's rows of a token sequence for next-token training and scoring, in local order (host int32).
struct TokenRows {
  Tensor ids;      // [T_loc]
  Tensor targets;  // [T_loc]: the next token of each row, −1 where the sequence has none or it is not counted
  std::vector<uint8_t> answer;  // [T_loc] 1 where the row's target is a retrieval answer; empty: none marked
};

// Per-token flags of a sequence (runtime/token_file.h TokenData): flag i belongs to token i, i.e.
// to the next-token term whose target is token i. Empty spans: every target counts, none is an answer.
struct TargetFlags {
  std::span<const uint8_t> counted;  // loss_mask
  std::span<const uint8_t> answer;
};

struct Segment {
  int index = 0;             // global segment index, 0 .. num_segments−1
  int64_t start = 0;         // global position of the segment's first token
  int64_t length = 0;
  int64_t local_offset = 0;  // row of its first token in the owner's local tensors
};

class SequenceLayout {
 public:
  // UserError for lengths the layout does not admit.
  static SequenceLayout zigzag(int64_t total_length, int world_size, int rank);
  // Smallest multiple of the layout's granularity (2P, or 1 for P = 1).
  static int64_t granularity(int world_size) { return world_size == 1 ? 1 : 2 * int64_t{world_size}; }

  int64_t total_length() const { return total_; }
  int world_size() const { return world_; }
  int rank() const { return rank_; }
  int num_segments() const { return world_ == 1 ? 1 : 2 * world_; }
  int64_t segment_length() const { return total_ / num_segments(); }
  int64_t local_length() const { return total_ / world_; }
  const std::vector<Segment>& local_segments() const { return local_; }
  // The segments rank `r` owns, in its local order.
  std::vector<Segment> segments_of(int r) const;
  int owner_of(int segment) const;
  // Global position of every local row.
  std::vector<int64_t> local_positions() const;
  // The zigzag scatter and gather, in one place:
  // this rank's rows of a global tensor [T, ...] (any dtype, its device), in local order;
  Tensor local_rows(const TensorView& global) const;
  // the inverse, on one rank's share: writes `local` [T_loc, ...] into its rows of `global` [T, ...];
  void place_local_rows(const TensorView& global, const TensorView& local) const;
  // ids and next-token targets of this rank's rows of `tokens`, which holds T = total_length()
  // tokens, or T + 1 (a training window: the last row's target is the extra token).
  // `flags` (same length as `tokens`): a row whose target is not counted gets target −1.
  TokenRows token_rows(std::span<const int32_t> tokens, const TargetFlags& flags = {}) const;

 private:
  int64_t total_ = 0;
  int world_ = 1;
  int rank_ = 0;
  std::vector<Segment> local_;
};

}  // namespace hydra
