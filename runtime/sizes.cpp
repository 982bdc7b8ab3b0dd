#include "runtime/sizes.h"

#include <cctype>
#include <limits>

#include "runtime/error.h"

namespace hydra {

int64_t parse_size(const std::string& text, const char* what) {
  HYDRA_USER_CHECK(!text.empty(), "{}: empty size", what);
  size_t i = 0;
  int64_t value = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    HYDRA_USER_CHECK(value < std::numeric_limits<int64_t>::max() / 10, "{}: '{}' is too large", what, text);
    value = value * 10 + (text[i] - '0');
    ++i;
  }
  HYDRA_USER_CHECK(i > 0, "{}: '{}' is not a size (examples: 4096, 128K, 1M)", what, text);
  int64_t scale = 1;
  if (i < text.size()) {
    const char unit = static_cast<char>(std::toupper(static_cast<unsigned char>(text[i])));
    scale = unit == 'K' ? 1024 : unit == 'M' ? 1024 * 1024 : unit == 'G' ? int64_t{1024} * 1024 * 1024 : 0;
    HYDRA_USER_CHECK(scale != 0 && i + 1 == text.size(), "{}: '{}' is not a size (examples: 4096, 128K, 1M)",
                     what, text);
  }
  HYDRA_USER_CHECK(value <= std::numeric_limits<int64_t>::max() / scale, "{}: '{}' is too large", what, text);
  return value * scale;
}

namespace {
std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : text) {
    if (c == ',') {
      parts.push_back(cur);
      cur.clear();
    } else if (!std::isspace(static_cast<unsigned char>(c))) {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}
}  // namespace

std::vector<int64_t> parse_size_list(const std::string& text, const char* what) {
  std::vector<int64_t> out;
  for (const auto& part : split_commas(text)) out.push_back(parse_size(part, what));
  return out;
}

std::vector<int64_t> parse_int_list(const std::string& text, const char* what) {
  std::vector<int64_t> out;
  for (const auto& part : split_commas(text)) {
    HYDRA_USER_CHECK(!part.empty(), "{}: empty entry in '{}'", what, text);
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    HYDRA_USER_CHECK(used == part.size() && used > 0, "{}: '{}' is not an integer", what, part);
    out.push_back(v);
  }
  return out;
}

std::string format_size(int64_t value) {
  if (value >= 1024 * 1024 && value % (1024 * 1024) == 0) return std::to_string(value / (1024 * 1024)) + "M";
  if (value >= 1024 && value % 1024 == 0) return std::to_string(value / 1024) + "K";
  return std::to_string(value);
}

}  // namespace hydra
