// The sequence-parallel layout (DESIGN.md §3.1): which tokens each rank owns, at which global positions.
//
// P > 1 ranks: zigzag. The sequence is cut into 2P equal segments; rank r owns segments r and
// 2P−1−r, stored one after the other in its local tensors ([T/P, ...] rows). Pairing an early and a
// late segment gives every rank the same amount of causal attention work. Lengths not divisible by
// 2P are refused with a message suggesting admissible ones (no silent padding).
// P = 1: one segment covering the whole sequence, so a single process takes any length.
//
// Packed documents (DESIGN.md §3.6): a sequence may be several documents back to back, given by
// their start positions (0 first, strictly increasing). Each then behaves exactly as if it ran
// alone: positions (RoPE, the FA τ) restart at its start, softmax attention never crosses a
// boundary, the GDN state and conv history start from zero. The layout carries the starts, so
// every part that crosses tokens (ring attention, the GDN scan, the conv halo) sees them; a
// document may span segments and ranks. Without starts the sequence is one document.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/tensor.h"

namespace hydra {

class Communicator;

// A rank's rows of a token sequence for next-token training and scoring, in local order (host int32).
struct TokenRows {
  Tensor ids;      // [T_loc]
  Tensor targets;  // [T_loc]: the next token of each row, −1 where the sequence has none or it is not counted
  std::vector<uint8_t> answer;  // [T_loc] 1 where the row's target is a retrieval answer; empty: none marked
};

// The loss_mask of a packed sequence (DESIGN.md §3.6): `counted` (empty: all 1) with the targets
// that would cross a document boundary — the first token of every document but the first, read by
// the last row of the one before — not counted. n: tokens (T, or T + 1 with the window's extra
// target); `starts`: document starts in [0, n), 0 first (empty or {0}: `counted` unchanged).
std::vector<uint8_t> counted_within_documents(std::span<const uint8_t> counted, int64_t n,
                                              std::span<const int64_t> starts);

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
  // UserError for lengths the layout does not admit (check_length). `document_starts`: empty (one
  // document) or 0 = s_0 < s_1 < … < total_length (asserted: callers build them from checked files).
  // A group's ranks build theirs with group_layout (below).
  static SequenceLayout zigzag(int64_t total_length, int world_size, int rank,
                               std::vector<int64_t> document_starts = {});
  // The layout's rule: a positive length, divisible by 2P over P > 1 ranks; a UserError naming the
  // length and the nearest lengths that are, otherwise. A model adds the conv halo's
  // (model/sequence_length.h check_sequence_length, what commands check before any work).
  static void check_length(int64_t total_length, int world_size);
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
  // ---- Documents ----
  bool has_documents() const { return !doc_starts_.empty(); }
  // This layout carrying document bounds even when it holds one document (its starts then {0}):
  // a sequence that may be packed, at the most it can hold — the bounds, and no segment cut at a
  // document start (the memory plans, model/memory_plan.h). It computes what this layout computes.
  SequenceLayout with_document_bounds() const;
  const std::vector<int64_t>& document_starts() const { return doc_starts_; }  // empty: one document
  // Global position of the first token of the document holding global position `pos` (0 without
  // documents), and one past its last token (total_length() without).
  int64_t document_start(int64_t pos) const;
  int64_t document_end(int64_t pos) const;
  // Per local row: its document's start (global position), and its position within its document
  // (what RoPE and τ read; the global position without documents).
  std::vector<int64_t> local_document_starts() const;
  std::vector<int64_t> local_document_positions() const;
  // The document starts s with begin < s < end: where a run of tokens [begin, end) must reset.
  std::vector<int64_t> starts_inside(int64_t begin, int64_t end) const;
  // The zigzag scatter and gather, in one place:
  // this rank's rows of a global tensor [T, ...] (any dtype, its device), in local order;
  Tensor local_rows(const TensorView& global) const;
  // the inverse, on one rank's share: writes `local` [T_loc, ...] into its rows of `global` [T, ...];
  void place_local_rows(const TensorView& global, const TensorView& local) const;
  // ids and next-token targets of this rank's rows of `tokens`, which holds T = total_length()
  // tokens, or T + 1 (a training window: the last row's target is the extra token).
  // `flags` (same length as `tokens`): a row whose target is not counted gets target −1.
  TokenRows token_rows(std::span<const int32_t> tokens, const TargetFlags& flags = {}) const;
  // The same from a sequence's ids [T], targets [T] (−1: none) and answer flags [T] (or empty).
  TokenRows rows_of(std::span<const int32_t> ids, std::span<const int32_t> targets,
                    std::span<const uint8_t> answer = {}) const;

 private:
  int64_t total_ = 0;
  int world_ = 1;
  int rank_ = 0;
  std::vector<Segment> local_;
  std::vector<int64_t> doc_starts_;
};

// This rank's layout of a sequence of `total_length` tokens over `group` (its size and rank): what
// every pass over a sequence group runs on.
SequenceLayout group_layout(const Communicator& group, int64_t total_length, std::vector<int64_t> document_starts = {});

}  // namespace hydra
