#include "model/train/data.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include <filesystem>
#include <fstream>

#include "runtime/atomic_file.h"
#include "runtime/content_hash.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/random.h"
#include "runtime/token_file.h"
#include "runtime/token_identity.h"

namespace hydra::train {
namespace {

// A file's document_offsets in order, read in blocks (the index pass): each offset is checked to
// exceed the one before.
class OffsetStream {
 public:
  explicit OffsetStream(const TokenReader& file) : file_(file) {}
  // The next offset, or -1 past the last.
  int64_t peek() {
    if (at_ == static_cast<int64_t>(block_.size())) {
      const int64_t first = read_ + 0, n = std::min<int64_t>(kBlock, file_.document_offset_count() - first);
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
    }
    return block_[static_cast<size_t>(at_)];
  }
  void pop() {
    if (peek() != -1) ++at_;
  }

 private:
  static constexpr int64_t kBlock = int64_t{1} << 20;
  const TokenReader& file_;
  std::vector<int64_t> block_;
  int64_t at_ = 0, read_ = 0, last_ = -1;
};

}  // namespace

TokenWindows::TokenWindows(const std::vector<std::string>& files, int64_t seq_len, uint64_t seed, int64_t vocab)
    : seq_len_(seq_len), seed_(seed) {
  open(files, vocab);
  build_index({});
}

void TokenWindows::open(const std::vector<std::string>& files, int64_t vocab) {
  HYDRA_USER_CHECK(!files.empty(), "no training data files given");
  HYDRA_USER_CHECK(seq_len_ >= 1, "--seq-len must be at least 1 (got {})", seq_len_);
  first_window_.push_back(0);
  for (const std::string& path : files) {
    files_.emplace_back(path, vocab);
    const int64_t n = files_.back().length();
    HYDRA_USER_CHECK(n >= seq_len_ + 1, "{}: holds {} tokens, shorter than one window of --seq-len {} + 1 (its targets)",
                     path, n, seq_len_);
    // Windows at offsets 0, seq_len, 2·seq_len, … while offset + seq_len + 1 ≤ n.
    first_window_.push_back(first_window_.back() + (n - 1) / seq_len_);
  }
  windows_ = first_window_.back();
}

void TokenWindows::build_index(const std::vector<std::string>& identities) {
  const bool flagged = std::any_of(files_.begin(), files_.end(),
                                   [](const TokenReader& f) { return f.has_mask() || f.has_documents(); });
  counted_.clear();
  if (!flagged) return;
  const int64_t seq_len = seq_len_;
  // The counted targets of every window: Σ loss_mask over its targets 1..seq_len, less the targets
  // that cross a document boundary b in (offset, offset + seq_len] (counted_within_documents), from
  // one streamed pass over each file's mask and offsets (blocks of ~16M tokens).
  counted_.assign(static_cast<size_t>(windows_), static_cast<int32_t>(seq_len));
  const int64_t block_windows = std::max<int64_t>(1, (int64_t{16} << 20) / seq_len);
  std::vector<uint8_t> mask;
  for (size_t f = 0; f < files_.size(); ++f) {
    const TokenReader& file = files_[f];
    if (!file.has_mask() && !file.has_documents()) continue;
    int32_t* index = counted_.data() + first_window_[f];
    const int64_t nw = first_window_[f + 1] - first_window_[f];
    std::string cached;  // the cache entry of this file's index, when its identity is known
    if (f < identities.size() && !identities[f].empty()) {
      const std::string key = fmt::format("{} seq_len {}", identities[f], seq_len);
      cached = (std::filesystem::path(token_identity_cache_dir()) / "token-index" /
                (hash_hex(hash_bytes(key.data(), key.size())) + ".i32")).string();
      std::ifstream in(cached, std::ios::binary);
      std::error_code ec;
      if (in && std::filesystem::file_size(cached, ec) == static_cast<uintmax_t>(nw) * 4 &&
          in.read(reinterpret_cast<char*>(index), nw * 4) &&
          std::all_of(index, index + nw, [&](int32_t c) { return c >= 0 && c <= seq_len; })) {
        continue;
      }
    }
    OffsetStream offsets(file);
    if (file.has_documents()) offsets.pop();  // offsets[0] = 0 starts the first window's document
    for (int64_t w0 = 0; w0 < nw; w0 += block_windows) {
      const int64_t w1 = std::min(nw, w0 + block_windows), base = w0 * seq_len;
      if (file.has_mask()) {
        mask.resize(static_cast<size_t>((w1 - w0) * seq_len + 1));
        file.read_mask(base, mask);
      }
      const auto m = [&](int64_t pos) { return file.has_mask() ? int64_t{mask[static_cast<size_t>(pos - base)]} : 1; };
      for (int64_t w = w0; w < w1; ++w) {
        const int64_t off = w * seq_len;
        int64_t c = seq_len;
        if (file.has_mask()) {
          const uint8_t* p = mask.data() + (off + 1 - base);
          c = std::accumulate(p, p + seq_len, int64_t{0});  // values checked 0/1 by read_mask
        }
        if (file.has_documents()) {
          for (int64_t b = offsets.peek(); b != -1 && b <= off + seq_len; b = offsets.peek()) {
            c -= m(b);  // b > off: the boundaries up to off belonged to the windows before
            offsets.pop();
          }
        }
        index[w] = static_cast<int32_t>(c);
      }
    }
    if (file.has_documents()) {  // the rest of the offsets, checked for order like the others
      while (offsets.peek() != -1) offsets.pop();
    }
    if (!cached.empty()) {  // a cache that cannot be written only costs this pass next time
      try {
        std::filesystem::create_directories(std::filesystem::path(cached).parent_path());
        AtomicFile out(cached);
        {
          std::ofstream o(out.temp_path(), std::ios::binary);
          o.write(reinterpret_cast<const char*>(index), nw * 4);
          HYDRA_USER_CHECK(o.good(), "writing {} failed", out.temp_path());
        }
        out.commit();
      } catch (const std::exception& e) {
        log::warn("the window index of {} is not cached ({})", file.path(), e.what());
      }
    }
  }
}

std::vector<DataSource> parse_data_sources(const std::string& list, const char* flag) {
  std::vector<DataSource> out;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t end = std::min(list.find(',', at), list.size());
    std::string item = list.substr(at, end - at);
    at = end + 1;
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    DataSource source{item, -1};
    if (const size_t colon = item.rfind(':'); colon != std::string::npos) {
      const std::string suffix = item.substr(colon + 1);
      char* stop = nullptr;
      const double w = std::strtod(suffix.c_str(), &stop);
      if (!suffix.empty() && stop == suffix.c_str() + suffix.size()) {
        HYDRA_USER_CHECK(std::isfinite(w) && w > 0, "{} {}: the weight {} must be a positive number", flag, item, suffix);
        source = DataSource{item.substr(0, colon), w};
      }
    }
    out.push_back(source);
  }
  return out;
}

namespace {
std::vector<std::string> paths_of(const std::vector<DataSource>& sources) {
  std::vector<std::string> paths;
  for (const DataSource& s : sources) paths.push_back(s.path);
  return paths;
}
}  // namespace

TokenWindows::TokenWindows(const std::vector<DataSource>& sources, int64_t seq_len, uint64_t seed, int64_t vocab,
                           bool shuffle)
    : seq_len_(seq_len), seed_(seed), shuffle_(shuffle) {
  open(paths_of(sources), vocab);
  std::vector<std::string> identities;
  for (const DataSource& s : sources) identities.push_back(s.identity);
  build_index(identities);
  double given = 0, unweighted_windows = 0;
  bool any = false, all = true;
  for (size_t f = 0; f < sources.size(); ++f) {
    if (sources[f].weight > 0) {
      given += sources[f].weight;
      any = true;
    } else {
      all = false;
      unweighted_windows += static_cast<double>(first_window_[f + 1] - first_window_[f]);
    }
  }
  if (!any) return;  // pooled
  HYDRA_USER_CHECK(all || given < 1, "the weights given sum to {}, leaving nothing for the files without one (they "
                   "share 1 − the sum, in proportion to their windows)", given);
  for (size_t f = 0; f < sources.size(); ++f) {
    const double windows = static_cast<double>(first_window_[f + 1] - first_window_[f]);
    weights_.push_back(sources[f].weight > 0 ? (all ? sources[f].weight / given : sources[f].weight)
                                             : (1 - given) * windows / unweighted_windows);
  }
  drawn_.assign(sources.size(), 0);
  file_epoch_.assign(sources.size(), -1);
  file_order_.resize(sources.size());
}

int64_t TokenWindows::file_window(int64_t f, int64_t k) const {
  const size_t fi = static_cast<size_t>(f);
  const int64_t n = first_window_[fi + 1] - first_window_[fi], epoch = k / n, i = k % n;
  if (!shuffle_) return first_window_[fi] + i;
  if (file_epoch_[fi] != epoch) {  // Fisher-Yates from (seed, file, epoch), as the pooled order
    std::vector<int64_t>& order = file_order_[fi];
    order.resize(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), int64_t{0});
    const RandomStream rng{seed_, hash_name("blend-order") + static_cast<uint64_t>(f) * 0x9E3779B97F4A7C15ull +
                                      static_cast<uint64_t>(epoch)};
    for (int64_t j = n - 1; j > 0; --j) {
      const int64_t r = static_cast<int64_t>(rng.bits(static_cast<uint64_t>(j)) % static_cast<uint64_t>(j + 1));
      std::swap(order[static_cast<size_t>(j)], order[static_cast<size_t>(r)]);
    }
    file_epoch_[fi] = epoch;
  }
  return first_window_[fi] + file_order_[fi][static_cast<size_t>(i)];
}

void TokenWindows::advance_to(int64_t n) const {
  if (n < base_) {  // before the draws kept: replay from the start
    cursor_ = base_ = 0;
    std::fill(drawn_.begin(), drawn_.end(), 0);
    recent_.clear();
  }
  while (cursor_ <= n) {
    size_t best = 0;
    double best_lag = -1e300;
    for (size_t f = 0; f < weights_.size(); ++f) {
      const double lag = weights_[f] * static_cast<double>(cursor_ + 1) - static_cast<double>(drawn_[f]);
      if (lag > best_lag) {
        best_lag = lag;
        best = f;
      }
    }
    recent_.push_back(file_window(static_cast<int64_t>(best), drawn_[best]));
    ++drawn_[best];
    ++cursor_;
    constexpr size_t kKept = size_t{1} << 17;  // draws kept for look-ups behind the cursor (a step's, a read-ahead's)
    if (recent_.size() > 2 * kKept) {
      recent_.erase(recent_.begin(), recent_.begin() + static_cast<std::ptrdiff_t>(kKept));
      base_ += static_cast<int64_t>(kKept);
    }
  }
}

std::vector<int64_t> TokenWindows::drawn(int64_t n) const {
  if (!blended()) return {};
  if (n > 0) advance_to(n - 1);
  if (n < base_) advance_to(n);  // replays: n ≥ base_ after it
  std::vector<int64_t> counts = drawn_;
  for (int64_t j = n; j < cursor_; ++j) --counts[static_cast<size_t>(file_of(recent_[static_cast<size_t>(j - base_)]))];
  return counts;
}

int64_t TokenWindows::tokens() const {
  int64_t n = 0;
  for (const TokenReader& f : files_) n += f.length();
  return n;
}

bool TokenWindows::masked() const {
  return std::any_of(files_.begin(), files_.end(), [](const TokenReader& f) { return f.has_mask(); });
}

bool TokenWindows::reads_on_any_thread() const {
  return std::all_of(files_.begin(), files_.end(), [](const TokenReader& f) { return f.reads_without_hdf5(); });
}

int64_t TokenWindows::index_of(int64_t n) const {
  HYDRA_ASSERT(n >= 0, "window {}", n);
  if (blended()) {
    advance_to(n);
    return recent_[static_cast<size_t>(n - base_)];
  }
  const int64_t epoch = n / count(), i = n % count();
  if (epoch != cached_epoch_) {  // Fisher-Yates from (seed, epoch): the same order on every rank and run
    order_.resize(static_cast<size_t>(count()));
    std::iota(order_.begin(), order_.end(), int64_t{0});
    const RandomStream rng{seed_, hash_name("data-order") + static_cast<uint64_t>(epoch)};
    for (int64_t j = count() - 1; j > 0; --j) {
      const int64_t k = static_cast<int64_t>(rng.bits(static_cast<uint64_t>(j)) % static_cast<uint64_t>(j + 1));
      std::swap(order_[static_cast<size_t>(j)], order_[static_cast<size_t>(k)]);
    }
    cached_epoch_ = epoch;
  }
  return order_[static_cast<size_t>(i)];
}

int64_t TokenWindows::file_of(int64_t i) const {
  HYDRA_ASSERT(i >= 0 && i < count(), "window {} of {}", i, count());
  return static_cast<int64_t>(std::upper_bound(first_window_.begin(), first_window_.end(), i) - first_window_.begin()) - 1;
}

Window TokenWindows::window_in_order(int64_t i) const { return window_in_order(i, {{0, seq_len_ + 1}}); }

Window TokenWindows::window_in_order(int64_t i, const TokenRanges& ranges) const {
  const int64_t f = file_of(i), n = seq_len_ + 1;
  const TokenReader& file = files_[static_cast<size_t>(f)];
  const int64_t offset = (i - first_window_[static_cast<size_t>(f)]) * seq_len_;
  Window w;
  w.ids.assign(static_cast<size_t>(n), 0);
  if (file.has_mask()) w.counted.assign(static_cast<size_t>(n), 0);
  if (file.has_answers()) w.answer.assign(static_cast<size_t>(n), 0);
  for (const auto& [begin, end] : ranges) {
    HYDRA_ASSERT(0 <= begin && begin <= end && end <= n, "range [{}, {}) of a window of {}", begin, end, n);
    const size_t b = static_cast<size_t>(begin), len = static_cast<size_t>(end - begin);
    file.read_ids(offset + begin, std::span<int32_t>(w.ids.data() + b, len));
    if (file.has_mask()) file.read_mask(offset + begin, std::span<uint8_t>(w.counted.data() + b, len));
    if (file.has_answers()) file.read_answer_flags(offset + begin, std::span<uint8_t>(w.answer.data() + b, len));
  }
  if (file.has_documents()) {
    // Boundaries in (offset, offset + seq_len]: the last one is the extra target's, which then starts
    // the next document: its target does not count (nor does any other crossing one).
    std::vector<int64_t> inside = file.document_offsets_in(offset, offset + seq_len_);
    for (int64_t& b : inside) b -= offset;
    if (!inside.empty()) {
      w.counted = counted_within_documents(w.counted, n, inside);
      w.document_starts.push_back(0);
      for (int64_t b : inside)
        if (b < seq_len_) w.document_starts.push_back(b);
      if (w.document_starts.size() == 1) w.document_starts.clear();
    }
  }
  return w;
}

int64_t TokenWindows::counted_targets_in_order(int64_t i) const {
  HYDRA_ASSERT(i >= 0 && i < count(), "window {} of {}", i, count());
  return counted_.empty() ? seq_len_ : counted_[static_cast<size_t>(i)];
}

PackedBatch pack_windows(const std::vector<Window>& windows) {
  PackedBatch b;
  const bool answers = std::any_of(windows.begin(), windows.end(), [](const Window& w) { return !w.answer.empty(); });
  for (const Window& w : windows) {
    const int64_t len = static_cast<int64_t>(w.ids.size()) - 1, base = static_cast<int64_t>(b.ids.size());
    if (w.document_starts.empty()) {
      b.document_starts.push_back(base);
    } else {
      for (int64_t s : w.document_starts) b.document_starts.push_back(base + s);
    }
    for (int64_t i = 0; i < len; ++i) {
      const size_t next = static_cast<size_t>(i + 1);
      const bool counted = w.counted.empty() || w.counted[next] != 0;
      b.ids.push_back(w.ids[static_cast<size_t>(i)]);
      b.targets.push_back(counted ? w.ids[next] : -1);
      b.counted += counted ? 1 : 0;
      if (answers) b.answer.push_back(w.answer.empty() ? 0 : w.answer[next]);
    }
  }
  if (b.document_starts.size() == 1) b.document_starts.clear();  // one window, one document
  return b;
}

StepWindows::StepWindows(const TokenWindows& data, const Shape& shape) : data_(data), shape_(shape) {
  // The zigzag segments of a packed micro-batch (batch_seqs windows of seq_len) this rank owns;
  // window k covers packed positions [k·L, (k+1)·L), and a row at window position j reads the id j
  // and the target j + 1.
  const int64_t len = data.seq_len();
  const SequenceLayout layout = SequenceLayout::zigzag(shape.batch_seqs * len, shape.sp, shape.sp_rank);
  ranges_.resize(static_cast<size_t>(shape.batch_seqs));
  for (int64_t k = 0; k < shape.batch_seqs; ++k) {
    TokenRanges& r = ranges_[static_cast<size_t>(k)];
    for (const Segment& s : layout.local_segments()) {
      const int64_t a = std::max(s.start, k * len), b = std::min(s.start + s.length, (k + 1) * len);
      if (a < b) r.emplace_back(a - k * len, b - k * len + 1);
    }
    std::sort(r.begin(), r.end());
    TokenRanges merged;
    for (const auto& x : r) {
      if (!merged.empty() && x.first <= merged.back().second) {
        merged.back().second = std::max(merged.back().second, x.second);
      } else {
        merged.push_back(x);
      }
    }
    r = std::move(merged);
  }
}

StepWindows::~StepWindows() {
  if (ahead_.valid()) ahead_.wait();
}

std::vector<int64_t> StepWindows::indices_of(int64_t position) const {
  std::vector<int64_t> indices;
  for (int64_t j = 0; j < shape_.batch_seqs * shape_.grad_accum; ++j) {
    indices.push_back(data_.index_of(position + j * shape_.replicas + shape_.replica));
  }
  return indices;
}

StepWindows::Batches StepWindows::read(const std::vector<int64_t>& indices) const {
  Batches batches(static_cast<size_t>(shape_.grad_accum));
  for (size_t j = 0; j < indices.size(); ++j) {
    const size_t k = j % static_cast<size_t>(shape_.batch_seqs);
    batches[j / static_cast<size_t>(shape_.batch_seqs)].push_back(data_.window_in_order(indices[j], ranges_[k]));
  }
  return batches;
}

std::vector<std::vector<Window>> StepWindows::take(int64_t position, int64_t next) {
  Batches batches;
  if (ahead_.valid()) {
    Batches ahead = ahead_.get();  // rethrows a read error of the thread here
    if (ahead_position_ == position) batches = std::move(ahead);
  }
  if (batches.empty()) batches = read(indices_of(position));
  if (next >= 0 && data_.reads_on_any_thread()) {
    // The window order is resolved here (index_of caches an epoch's order: calling thread only);
    // the thread only reads files through pread.
    ahead_position_ = next;
    ahead_ = std::async(std::launch::async, [this, indices = indices_of(next)] { return read(indices); });
  }
  return batches;
}

}  // namespace hydra::train
