// Token files (DESIGN.md §4): HDF5 with a dataset `input_ids`, int32 or int64, shape [T], and
// optional per-token datasets beside it:
//   loss_mask   [T] integer 0/1 (uint8 as written here): loss_mask[i] = 1 counts the next-token
//               term whose target is input_ids[i]; position 0 is never a target. Absent: all 1.
//   answer_start, answer_length  [M] int64 (hydra synth): spans of retrieval answers, reported apart
//               from the other targets by training and evaluation.
//   document_offsets  [N+1] integer, 0 = o_0 < o_1 < … < o_N = T: packed documents (DESIGN.md §3.6),
//               document i is input_ids[o_i, o_{i+1}); each runs as if alone.
#pragma once

#include <cstdint>
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

}  // namespace hydra
