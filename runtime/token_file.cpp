#include "runtime/token_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <numeric>
#include <cerrno>
#include <cstring>

#include "runtime/atomic_file.h"
#include "runtime/hdf5_file.h"

namespace hydra {

namespace {
// input_ids: present, 1-D, of an integer type (any width: tokenize_text.py writes the narrowest that
// holds the vocabulary; ids are read as int32, so an unsigned 32-bit or wider type must hold ids
// below 2^31, which the readers check), non-empty.
H5File::IntegerVectorInfo input_ids_info(const H5File& file, const std::string& path) {
  HYDRA_USER_CHECK(file.has_dataset("input_ids"), "{}: no 'input_ids' dataset", path);
  if (!file.is_integer_vector("input_ids")) {  // say what it is instead
    const DatasetInfo info = file.dataset_info("input_ids");
    HYDRA_USER_CHECK(info.shape.size() == 1, "{}: 'input_ids' has {} dimensions, expected 1 ([T])", path,
                     info.shape.size());
    HYDRA_USER_FAIL("{}: 'input_ids' is {}, expected int32 or int64 (or a narrower integer type)", path,
                    dtype_name(info.dtype));
  }
  // Its storage checked against its shape (H5File::check_storage: a chunk never written is an error).
  const H5File::IntegerVectorInfo ids = file.integer_vector_info("input_ids");
  HYDRA_USER_CHECK(ids.length > 0, "{}: input is empty (input_ids has 0 tokens)", path);
  return ids;
}
// "no entries", "1 entry: [5]", "3 entries, 0 .. 12": what a document_offsets dataset holds, for messages.
std::string offsets_summary(int64_t n, int64_t first, int64_t last) {
  if (n == 0) return "no entries";
  if (n == 1) return fmt::format("1 entry: [{}]", first);
  return fmt::format("{} entries, {} .. {}", n, first, last);
}
}  // namespace

int64_t token_file_length(const std::string& path) {
  const H5File file = H5File::open_read(path);
  return input_ids_info(file, path).length;
}

std::vector<int32_t> read_token_file(const std::string& path, int64_t vocab_size) {
  H5File file = H5File::open_read(path);
  input_ids_info(file, path);
  const std::vector<int64_t> raw = file.read_integer_vector("input_ids");  // any width, as int64
  std::vector<int32_t> ids(raw.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t v = raw[i];
    HYDRA_USER_CHECK(v >= 0 && v < vocab_size, "{}: token id {} at position {} is outside the vocabulary [0, {})", path,
                     v, i, vocab_size);
    ids[i] = static_cast<int32_t>(v);
  }
  return ids;
}

void write_token_file(const std::string& path, const std::vector<int32_t>& ids) { write_token_data(path, ids, {}); }

void write_token_data(const std::string& path, const std::vector<int32_t>& ids, const std::vector<uint8_t>& loss_mask,
                      const std::vector<int64_t>& document_offsets) {
  HYDRA_ASSERT(loss_mask.empty() || loss_mask.size() == ids.size(), "loss mask of {} for {} tokens", loss_mask.size(),
               ids.size());
  require_writable_destination(path, "token file");
  AtomicFile out(path);
  H5File file = H5File::create(out.temp_path());
  file.write("input_ids", TensorView(const_cast<int32_t*>(ids.data()), DType::i32, Device::host,
                                     {static_cast<int64_t>(ids.size())}));
  if (!loss_mask.empty()) file.write_uint8("loss_mask", loss_mask);
  if (!document_offsets.empty()) {
    file.write("document_offsets", TensorView(const_cast<int64_t*>(document_offsets.data()), DType::i64, Device::host,
                                              {static_cast<int64_t>(document_offsets.size())}));
  }
  file.close();
  out.commit();
}

TokenData read_token_data(const std::string& path, int64_t vocab_size) {
  TokenData data;
  data.ids = read_token_file(path, vocab_size);
  const int64_t t = static_cast<int64_t>(data.ids.size());
  const H5File file = H5File::open_read(path);
  if (file.has_dataset("loss_mask")) {
    const std::vector<int64_t> mask = file.read_integer_vector("loss_mask");
    HYDRA_USER_CHECK(static_cast<int64_t>(mask.size()) == t, "{}: loss_mask has {} entries, input_ids {}", path,
                     mask.size(), t);
    data.loss_mask.resize(mask.size());
    for (size_t i = 0; i < mask.size(); ++i) {
      HYDRA_USER_CHECK(mask[i] == 0 || mask[i] == 1, "{}: loss_mask[{}] is {}; it must be 0 or 1", path, i, mask[i]);
      data.loss_mask[i] = static_cast<uint8_t>(mask[i]);
    }
  }
  if (file.has_dataset("answer_start") || file.has_dataset("answer_length")) {
    const std::vector<int64_t> start = file.read_integer_vector("answer_start");
    const std::vector<int64_t> length = file.read_integer_vector("answer_length");
    HYDRA_USER_CHECK(start.size() == length.size(), "{}: answer_start has {} entries, answer_length {}", path,
                     start.size(), length.size());
    data.answer.assign(data.ids.size(), 0);
    for (size_t j = 0; j < start.size(); ++j) {
      HYDRA_USER_CHECK(start[j] >= 1 && length[j] >= 1 && length[j] <= t && start[j] <= t - length[j],
                       "{}: answer span {} ([{}, +{})) lies outside the {} tokens (or starts at 0)", path, j, start[j],
                       length[j], t);
      std::fill(data.answer.begin() + start[j], data.answer.begin() + start[j] + length[j], uint8_t{1});
    }
  }
  if (file.has_dataset("document_offsets")) {
    data.document_offsets = file.read_integer_vector("document_offsets");
    const std::vector<int64_t>& o = data.document_offsets;
    HYDRA_USER_CHECK(o.size() >= 2 && o.front() == 0 && o.back() == t,
                     "{}: document_offsets must run from 0 to the {} tokens (got {})", path, t,
                     offsets_summary(static_cast<int64_t>(o.size()), o.empty() ? 0 : o.front(), o.empty() ? 0 : o.back()));
    for (size_t i = 1; i < o.size(); ++i) {
      HYDRA_USER_CHECK(o[i] > o[i - 1], "{}: document_offsets[{}] = {} does not exceed document_offsets[{}] = {} "
                       "(documents must be non-empty, in order)", path, i, o[i], i - 1, o[i - 1]);
    }
  }
  return data;
}

}  // namespace hydra

// ---- TokenReader ----

namespace hydra {

struct TokenReader::State {
  std::string path;
  int64_t vocab = 0;
  H5File file;
  int fd = -1;
  H5File::IntegerVectorInfo ids, mask, offsets;  // mask/offsets: length 0 when absent
  bool has_mask = false, has_documents = false;
  std::vector<std::pair<int64_t, int64_t>> answers;  // disjoint [begin, end) spans, in order

  explicit State(const std::string& p) : path(p), file(H5File::open_read(p)) {}
  ~State() {
    if (fd >= 0) ::close(fd);
  }
  // count elements of `width` bytes from element `first` of a contiguous dataset at `offset`.
  void pread_elements(int64_t offset, int width, int64_t first, int64_t count, void* out, const char* name) const {
    char* dst = static_cast<char*>(out);
    size_t left = static_cast<size_t>(count) * static_cast<size_t>(width);
    off_t at = static_cast<off_t>(offset + first * width);
    while (left > 0) {
      const ssize_t n = ::pread(fd, dst, left, at);
      if (n < 0 && errno == EINTR) continue;
      HYDRA_USER_CHECK(n > 0, "{}: reading '{}' [{}, +{}) failed: {}", path, name, first, count,
                       n == 0 ? "the file ends early (truncated?)" : std::strerror(errno));
      dst += n;
      at += n;
      left -= static_cast<size_t>(n);
    }
  }
};

TokenReader::TokenReader(const std::string& path, int64_t vocab_size) : s_(std::make_unique<State>(path)) {
  State& s = *s_;
  s.vocab = vocab_size;
  s.ids = input_ids_info(s.file, path);  // present, integer, 1-D, non-empty
  const int64_t t = s.ids.length;
  if (s.file.has_dataset("loss_mask")) {
    s.mask = s.file.integer_vector_info("loss_mask");
    s.has_mask = true;
    HYDRA_USER_CHECK(s.mask.length == t, "{}: loss_mask has {} entries, input_ids {}", path, s.mask.length, t);
  }
  if (s.file.has_dataset("document_offsets")) {
    s.offsets = s.file.integer_vector_info("document_offsets");
    s.has_documents = true;
    const int64_t n = s.offsets.length;
    int64_t ends[2] = {-1, -1};
    if (n >= 1) {
      s.file.read_integer_range("document_offsets", 0, std::span<int64_t>(ends, 1));
      s.file.read_integer_range("document_offsets", n - 1, std::span<int64_t>(ends + 1, 1));
    }
    // The same words as read_token_data's check.
    HYDRA_USER_CHECK(n >= 2 && ends[0] == 0 && ends[1] == t,
                     "{}: document_offsets must run from 0 to the {} tokens (got {})", path, t,
                     offsets_summary(n, ends[0], ends[1]));
  }
  if (s.file.has_dataset("answer_start") || s.file.has_dataset("answer_length")) {
    const std::vector<int64_t> start = s.file.read_integer_vector("answer_start");
    const std::vector<int64_t> length = s.file.read_integer_vector("answer_length");
    HYDRA_USER_CHECK(start.size() == length.size(), "{}: answer_start has {} entries, answer_length {}", path,
                     start.size(), length.size());
    for (size_t j = 0; j < start.size(); ++j) {
      HYDRA_USER_CHECK(start[j] >= 1 && length[j] >= 1 && length[j] <= t && start[j] <= t - length[j],
                       "{}: answer span {} ([{}, +{})) lies outside the {} tokens (or starts at 0)", path, j, start[j],
                       length[j], t);
      s.answers.emplace_back(start[j], start[j] + length[j]);
    }
    // Disjoint spans in order: a range's flags are found by bisection.
    std::sort(s.answers.begin(), s.answers.end());
    std::vector<std::pair<int64_t, int64_t>> merged;
    for (const auto& a : s.answers) {
      if (!merged.empty() && a.first <= merged.back().second) {
        merged.back().second = std::max(merged.back().second, a.second);
      } else {
        merged.push_back(a);
      }
    }
    s.answers = std::move(merged);
    if (s.answers.empty()) s.answers.emplace_back(0, 0);  // the file marks answers (none): flags all 0
  }
  if (reads_without_hdf5()) {
    s.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    HYDRA_USER_CHECK(s.fd >= 0, "cannot read {}: {}", path, std::strerror(errno));
  }
}

TokenReader::~TokenReader() = default;
TokenReader::TokenReader(TokenReader&&) noexcept = default;
TokenReader& TokenReader::operator=(TokenReader&&) noexcept = default;

const std::string& TokenReader::path() const { return s_->path; }
int64_t TokenReader::length() const { return s_->ids.length; }
bool TokenReader::has_mask() const { return s_->has_mask; }
bool TokenReader::has_answers() const { return !s_->answers.empty(); }
bool TokenReader::has_documents() const { return s_->has_documents; }
int64_t TokenReader::document_offset_count() const { return s_->offsets.length; }

bool TokenReader::reads_without_hdf5() const {
  const State& s = *s_;
  return s.ids.file_offset && (!s.has_mask || (s.mask.file_offset && s.mask.width == 1)) &&
         (!s.has_documents || (s.offsets.file_offset && s.offsets.width == 8 && s.offsets.is_signed));
}

void TokenReader::read_ids(int64_t first, std::span<int32_t> out) const {
  const State& s = *s_;
  const int64_t n = static_cast<int64_t>(out.size());
  HYDRA_ASSERT(first >= 0 && first + n <= s.ids.length, "{}: ids [{}, +{}) of {}", s.path, first, n, s.ids.length);
  const auto check = [&](int64_t i, int64_t v) {
    HYDRA_USER_CHECK(v >= 0 && v < s.vocab, "{}: token id {} at position {} is outside the vocabulary [0, {})", s.path,
                     v, first + i, s.vocab);
  };
  if (s.fd >= 0 && s.ids.width == 4 && s.ids.is_signed) {  // int32: read in place
    s.pread_elements(*s.ids.file_offset, 4, first, n, out.data(), "input_ids");
    for (int64_t i = 0; i < n; ++i) check(i, out[static_cast<size_t>(i)]);
    return;
  }
  if (s.fd >= 0) {  // another width: the stored bytes, then each value widened (little-endian storage)
    std::vector<uint8_t> raw(static_cast<size_t>(n * s.ids.width));
    s.pread_elements(*s.ids.file_offset, s.ids.width, first, n, raw.data(), "input_ids");
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* p = raw.data() + i * s.ids.width;
      int64_t v = 0;
      switch (s.ids.width * (s.ids.is_signed ? -1 : 1)) {
        case 1: v = *p; break;
        case -1: v = static_cast<int8_t>(*p); break;
        case 2: { uint16_t x; std::memcpy(&x, p, 2); v = x; break; }
        case -2: { int16_t x; std::memcpy(&x, p, 2); v = x; break; }
        case 4: { uint32_t x; std::memcpy(&x, p, 4); v = x; break; }
        case -8: { int64_t x; std::memcpy(&x, p, 8); v = x; break; }
        default: { uint64_t x; std::memcpy(&x, p, 8); v = x > uint64_t{INT64_MAX} ? -1 : static_cast<int64_t>(x); break; }
      }
      check(i, v);
      out[static_cast<size_t>(i)] = static_cast<int32_t>(v);
    }
    return;
  }
  std::vector<int64_t> wide(static_cast<size_t>(n));
  s.file.read_integer_range("input_ids", first, std::span<int64_t>(wide));
  for (int64_t i = 0; i < n; ++i) {
    check(i, wide[static_cast<size_t>(i)]);
    out[static_cast<size_t>(i)] = static_cast<int32_t>(wide[static_cast<size_t>(i)]);
  }
}

void TokenReader::read_mask(int64_t first, std::span<uint8_t> out) const {
  const State& s = *s_;
  const int64_t n = static_cast<int64_t>(out.size());
  HYDRA_ASSERT(s.has_mask && first >= 0 && first + n <= s.mask.length, "{}: mask [{}, +{})", s.path, first, n);
  if (s.fd >= 0) {
    s.pread_elements(*s.mask.file_offset, 1, first, n, out.data(), "loss_mask");
  } else {
    std::vector<int64_t> wide(static_cast<size_t>(n));  // any stored width, converted by HDF5
    s.file.read_integer_range("loss_mask", first, std::span<int64_t>(wide));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = wide[static_cast<size_t>(i)];
      HYDRA_USER_CHECK(v == 0 || v == 1, "{}: loss_mask[{}] is {}; it must be 0 or 1", s.path, first + i, v);
      out[static_cast<size_t>(i)] = static_cast<uint8_t>(v);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    HYDRA_USER_CHECK(out[static_cast<size_t>(i)] <= 1, "{}: loss_mask[{}] is {}; it must be 0 or 1", s.path, first + i,
                     out[static_cast<size_t>(i)]);
  }
}

void TokenReader::read_answer_flags(int64_t first, std::span<uint8_t> out) const {
  const auto& spans = s_->answers;
  std::fill(out.begin(), out.end(), uint8_t{0});
  const int64_t end = first + static_cast<int64_t>(out.size());
  // The first span ending after `first`, then every span starting before `end`.
  auto it = std::upper_bound(spans.begin(), spans.end(), first,
                             [](int64_t pos, const std::pair<int64_t, int64_t>& a) { return pos < a.second; });
  for (; it != spans.end() && it->first < end; ++it) {
    for (int64_t i = std::max(first, it->first); i < std::min(end, it->second); ++i) out[static_cast<size_t>(i - first)] = 1;
  }
}

void TokenReader::read_document_offsets(int64_t first, std::span<int64_t> out) const {
  const State& s = *s_;
  const int64_t n = static_cast<int64_t>(out.size());
  HYDRA_ASSERT(s.has_documents && first >= 0 && first + n <= s.offsets.length, "{}: offsets [{}, +{})", s.path, first, n);
  if (s.fd >= 0) {
    s.pread_elements(*s.offsets.file_offset, 8, first, n, out.data(), "document_offsets");
  } else {
    s.file.read_integer_range("document_offsets", first, out);
  }
}

std::vector<int64_t> TokenReader::document_offsets_in(int64_t lo, int64_t hi) const {
  std::vector<int64_t> found;
  if (!s_->has_documents) return found;
  // The first index whose offset exceeds lo (offsets[0] = 0 ≤ lo).
  const auto at = [&](int64_t i) {
    int64_t v = 0;
    read_document_offsets(i, std::span<int64_t>(&v, 1));
    return v;
  };
  int64_t a = 0, b = s_->offsets.length;  // offsets[a] ≤ lo < offsets[b] (b: past the end)
  while (b - a > 1) {
    const int64_t mid = a + (b - a) / 2;
    if (at(mid) <= lo) a = mid; else b = mid;
  }
  for (int64_t i = b; i < s_->offsets.length; ++i) {
    const int64_t v = at(i);
    if (v > hi) break;
    found.push_back(v);
  }
  return found;
}

namespace {

// A file's document_offsets in order, read in blocks, each offset checked to exceed the one before.
class OffsetStream {
 public:
  OffsetStream(const TokenReader& file, const std::function<void(std::span<const int64_t>)>& hook)
      : file_(file), hook_(hook) {}
  // The next offset, or -1 past the last.
  int64_t peek() {
    if (at_ == static_cast<int64_t>(block_.size())) {
      const int64_t first = read_, n = std::min<int64_t>(kBlock, file_.document_offset_count() - first);
      if (n <= 0) return -1;
      block_.resize(static_cast<size_t>(n));
      file_.read_document_offsets(first, block_);
      read_ += n;
      at_ = 0;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t v = block_[static_cast<size_t>(i)];
        HYDRA_USER_CHECK(v > last_, "{}: document_offsets[{}] = {} does not exceed document_offsets[{}] = {} "
                         "(documents must be non-empty, in order)", file_.path(), first + i, v, first + i - 1, last_);
        last_ = v;
      }
      if (hook_) hook_(block_);
    }
    return block_[static_cast<size_t>(at_)];
  }
  void pop() {
    if (peek() != -1) ++at_;
  }

 private:
  static constexpr int64_t kBlock = int64_t{1} << 20;
  const TokenReader& file_;
  const std::function<void(std::span<const int64_t>)>& hook_;
  std::vector<int64_t> block_;
  int64_t at_ = 0, read_ = 0, last_ = -1;
};

}  // namespace

std::vector<int32_t> count_window_targets(const TokenReader& file, int64_t seq_len, const TokenFlagHooks& hooks,
                                          int64_t block_tokens) {
  HYDRA_ASSERT(seq_len >= 0 && block_tokens >= 1, "count_window_targets: seq_len {}, blocks of {}", seq_len, block_tokens);
  const int64_t t = file.length(), windows = seq_len > 0 ? (t - 1) / seq_len : 0;
  const bool masked = file.has_mask();
  // Without a mask every target counts; with one, the sums are accumulated block by block.
  std::vector<int32_t> counted(static_cast<size_t>(windows), masked ? 0 : static_cast<int32_t>(seq_len));
  // A target at position p (1 ≤ p) belongs to window (p − 1)/seq_len, when that window exists.
  const auto window_of = [&](int64_t p) { return seq_len > 0 && p >= 1 ? (p - 1) / seq_len : windows; };
  OffsetStream offsets(file, hooks.offsets);
  const int64_t kBlock = block_tokens;
  std::vector<uint8_t> mask;
  // Blocks of the stream [a, e): the mask's sums, then the document starts b in [a, e) (their mask
  // values are in this block).
  for (int64_t a = 0; a < t; a += kBlock) {
    const int64_t e = std::min(t, a + kBlock);
    if (masked) {
      mask.resize(static_cast<size_t>(e - a));
      file.read_mask(a, mask);  // values checked 0/1 where read
      if (hooks.mask) hooks.mask(mask);
      for (int64_t p = std::max<int64_t>(a, 1); p < e;) {
        const int64_t w = window_of(p);
        if (w >= windows) break;
        const int64_t end = std::min(e, (w + 1) * seq_len + 1);  // the window's last target + 1
        counted[static_cast<size_t>(w)] +=
            static_cast<int32_t>(std::accumulate(mask.begin() + (p - a), mask.begin() + (end - a), int64_t{0}));
        p = end;
      }
    }
    if (!file.has_documents()) continue;
    for (int64_t b = offsets.peek(); b != -1 && b < e; b = offsets.peek()) {
      const int64_t w = window_of(b);
      if (w < windows) counted[static_cast<size_t>(w)] -= masked ? mask[static_cast<size_t>(b - a)] : 1;
      offsets.pop();
    }
  }
  while (offsets.peek() != -1) offsets.pop();  // the last offset (T), checked and hooked like the others
  return counted;
}

}  // namespace hydra
