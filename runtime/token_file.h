// Token files (DESIGN.md §4): HDF5 with a dataset `input_ids`, int32 or int64, shape [T].
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

}  // namespace hydra
