// Sizes on the command line: "524288", "512K", "1M", "2M" (K = 1024, M = 1024², G = 1024³),
// and comma-separated lists of them ("4K,16K,64K").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hydra {

// UserError naming `what` when `text` is not a size.
int64_t parse_size(const std::string& text, const char* what);
std::vector<int64_t> parse_size_list(const std::string& text, const char* what);
std::vector<int64_t> parse_int_list(const std::string& text, const char* what);
// 524288 -> "512K", 1000 -> "1000".
std::string format_size(int64_t value);

}  // namespace hydra
