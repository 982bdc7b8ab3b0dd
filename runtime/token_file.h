// Token files (DESIGN.md §4): HDF5 with a dataset `input_ids`, shape [T], of an integer type (int32 or
// int64, or narrower: cluster/tokenize_text.py writes uint8/uint16 for small vocabularies), and
// optional per-token datasets beside it:
//   loss_mask   [T] integer 0/1 (uint8 as written here): loss_mask[i] = 1 counts the next-token
//               term whose target is input_ids[i]; position 0 is never a target. Absent: all 1.
//   answer_start, answer_length  [M] int64 (hydra synth): spans of retrieval answers, reported apart
//               from the other targets by training and evaluation.
//   document_offsets  [N+1] integer, 0 = o_0 < o_1 < … < o_N = T: packed documents (DESIGN.md §3.6),
//               document i is input_ids[o_i, o_{i+1}); each runs as if alone.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace hydra {

// Reads and checks `input_ids`: present, 1-D, integer, non-empty, every id in [0, vocab_size).
// UserError naming the file and the first offending position otherwise.
std::vector<int32_t> read_token_file(const std::string& path, int64_t vocab_size);
// The number of tokens in `input_ids`, from the dataset's shape alone (nothing else is read), with the
// same checks of the dataset's presence, type and rank.
int64_t token_file_length(const std::string& path);
void write_token_file(const std::string& path, const std::vector<int32_t>& ids);

// A token file with its per-token flags.
struct TokenData {
  std::vector<int32_t> ids;        // [T]
  std::vector<uint8_t> loss_mask;  // [T] 0/1, or empty: every target counts
  std::vector<uint8_t> answer;     // [T] 1 inside an answer span, or empty: the file marks none
  std::vector<int64_t> document_offsets;  // [N+1], or empty: the stream is one document
  bool counts(int64_t i) const { return loss_mask.empty() || loss_mask[static_cast<size_t>(i)] != 0; }
  bool is_answer(int64_t i) const { return !answer.empty() && answer[static_cast<size_t>(i)] != 0; }
};
// The document starts of a file's document_offsets (all but the last offset; empty: one document).
inline std::vector<int64_t> document_starts_of(const TokenData& data) {
  return data.document_offsets.empty() ? std::vector<int64_t>{}
                                       : std::vector<int64_t>(data.document_offsets.begin(), data.document_offsets.end() - 1);
}

// input_ids as read_token_file, and the optional datasets: a loss_mask of another length or with a
// value other than 0/1, or an answer span outside the stream, is a UserError naming the file.
TokenData read_token_data(const std::string& path, int64_t vocab_size);
// input_ids, and loss_mask unless `loss_mask` is empty (atomically).
void write_token_data(const std::string& path, const std::vector<int32_t>& ids, const std::vector<uint8_t>& loss_mask,
                      const std::vector<int64_t>& document_offsets = {});

// A token file read on demand (hydra train, eval-lm: corpora larger than memory). Opening reads the
// datasets' shapes and types and the answer spans (O(spans)), never a per-token dataset whole: the
// ids, the loss_mask and the document offsets are read by range, in their stored width. A dataset
// stored contiguously (h5py's and hydra's default) is read with pread at its offset in the file: no
// HDF5 call, so any thread may read (the trainer prefetches on one), and nothing is mapped, so the
// resident memory holds only the ranges read (a memory map would count every page touched).
// Chunked or compressed datasets are read as HDF5 hyperslabs, from the opening thread only
// (reads_without_hdf5() says which).
// Values are checked where read: an id outside [0, vocab), a mask value other than 0/1 or document
// offsets out of order are a UserError naming the file and the position.
class TokenReader {
 public:
  TokenReader(const std::string& path, int64_t vocab_size);
  ~TokenReader();
  TokenReader(TokenReader&&) noexcept;
  TokenReader& operator=(TokenReader&&) noexcept;

  const std::string& path() const;
  int64_t length() const;     // tokens
  bool has_mask() const;
  bool has_answers() const;
  bool has_documents() const;
  int64_t document_offset_count() const;  // N + 1, or 0 without documents
  bool reads_without_hdf5() const;        // every range read is a pread (thread-safe)

  // Tokens [first, first + out.size()).
  void read_ids(int64_t first, std::span<int32_t> out) const;
  void read_mask(int64_t first, std::span<uint8_t> out) const;  // has_mask() only
  void read_answer_flags(int64_t first, std::span<uint8_t> out) const;  // 1 inside an answer span
  // document_offsets[first, first + out.size()) (has_documents() only), not checked for order.
  void read_document_offsets(int64_t first, std::span<int64_t> out) const;
  // The document offsets o with lo < o ≤ hi, by bisection over the stored offsets (O(log N) reads).
  std::vector<int64_t> document_offsets_in(int64_t lo, int64_t hi) const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// One streamed pass over a token file's loss_mask and document_offsets (blocks of 16M tokens, bounded
// memory), in file order, each block shown to the hooks as read — the content identity
// (runtime/token_identity.h) hashes them in the same pass that counts the windows' targets, so a first
// start reads the file once. The offsets are checked for order (a UserError naming the position).
// With seq_len > 0 it returns the counted targets of every window of seq_len tokens at offsets 0,
// seq_len, 2·seq_len, … ((T − 1)/seq_len of them: window w's targets are the tokens (w·L, w·L + L]):
// Σ loss_mask over those targets, less the targets at a document start inside them (a document's first
// token is never predicted from the one before). With seq_len = 0 it returns nothing (hooks only).
struct TokenFlagHooks {
  std::function<void(std::span<const uint8_t>)> mask;       // the loss_mask, [0, T) in order
  std::function<void(std::span<const int64_t>)> offsets;    // document_offsets, [0, N + 1) in order
};
// `block_tokens`: the tokens read at a time (tests use small blocks to cross their boundaries).
std::vector<int32_t> count_window_targets(const TokenReader& file, int64_t seq_len, const TokenFlagHooks& hooks = {},
                                          int64_t block_tokens = int64_t{1} << 24);

}  // namespace hydra
