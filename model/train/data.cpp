#include "model/train/data.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>

#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/random.h"
#include "runtime/token_file.h"
#include "runtime/token_identity.h"

namespace hydra::train {

TokenWindows::TokenWindows(const std::vector<std::string>& files, int64_t seq_len, uint64_t seed, int64_t vocab)
    : seq_len_(seq_len), seed_(seed) {
  open(files, vocab);
  build_index({});
  for (size_t f = 0; f < files.size(); ++f) {
    corpus_names_.push_back(files[f]);
    corpus_first_.push_back(first_window_[f]);
  }
  corpus_first_.push_back(windows_);
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
  // The counted targets of every window (runtime/token_file.h count_window_targets): from the cache
  // when the file's content identity is known and its index of this length was counted before (by the
  // identity's own pass on a first start), else one streamed pass over the mask and offsets.
  counted_.assign(static_cast<size_t>(windows_), static_cast<int32_t>(seq_len_));
  for (size_t f = 0; f < files_.size(); ++f) {
    const TokenReader& file = files_[f];
    if (!file.has_mask() && !file.has_documents()) continue;
    const int64_t nw = first_window_[f + 1] - first_window_[f];
    const std::string identity = f < identities.size() ? identities[f] : "";
    std::optional<std::vector<int32_t>> index;
    if (!identity.empty()) index = load_window_index(identity, seq_len_, nw);
    index_from_cache_ = index_from_cache_ || index.has_value();
    if (!index) {
      index = count_window_targets(file, seq_len_);
      if (!identity.empty()) store_window_index(identity, seq_len_, *index, file.path());
    }
    HYDRA_ASSERT(static_cast<int64_t>(index->size()) == nw, "{}: {} windows counted, {} expected", file.path(),
                 index->size(), nw);
    std::copy(index->begin(), index->end(), counted_.begin() + first_window_[f]);
  }
}

std::vector<std::string> corpus_shards(const std::string& path, const char* flag) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path manifest = fs::is_directory(path, ec) ? fs::path(path) / "manifest.json" : fs::path(path);
  const fs::path folder = manifest.has_parent_path() ? manifest.parent_path() : fs::path(".");
  std::ifstream in(manifest);
  HYDRA_USER_CHECK(in.good(), "{} {}: no readable {} (a corpus folder holds the manifest.json that "
                   "cluster/tokenize_text.py writes)", flag, path, manifest.string());
  const nlohmann::json m = nlohmann::json::parse(in, nullptr, false);
  HYDRA_USER_CHECK(m.is_object() && m.contains("shards") && m.at("shards").is_array() && !m.at("shards").empty(),
                   "{} {}: {} is not a token-shard manifest (a JSON object with a non-empty \"shards\" list)", flag, path,
                   manifest.string());
  const fs::path real_folder = fs::canonical(folder.empty() ? fs::path(".") : folder, ec);
  HYDRA_USER_CHECK(!ec, "{} {}: cannot resolve the folder {} ({})", flag, path, folder.string(), ec.message());
  std::vector<std::string> shards;
  for (const nlohmann::json& entry : m.at("shards")) {
    HYDRA_USER_CHECK(entry.is_string(), "{} {}: {} lists a shard that is not a file name ({})", flag, path,
                     manifest.string(), entry.dump().substr(0, 80));
    const std::string name = entry.get<std::string>();
    // A plain name inside the manifest's folder: nothing in a manifest makes us read outside it.
    const bool plain = !name.empty() && name != "." && name != ".." && name.find_first_of("/\\") == std::string::npos &&
                       name.find('\0') == std::string::npos;
    HYDRA_USER_CHECK(plain, "{} {}: {} lists the shard '{}', which is not a plain file name in the manifest's folder "
                     "(written by an older cluster/tokenize_text.py? its paths were relative to where it ran: "
                     "tokenize again)", flag, path, manifest.string(), name);
    const fs::path shard = folder / name;
    if (fs::exists(shard, ec)) {
      const fs::path real = fs::canonical(shard, ec);
      HYDRA_USER_CHECK(!ec && real.parent_path() == real_folder, "{} {}: the shard '{}' of {} resolves to {}, outside "
                       "the manifest's folder", flag, path, name, manifest.string(), ec ? ec.message() : real.string());
    }
    shards.push_back(shard.string());
  }
  return shards;
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
    DataSource source{.path = item, .weight = -1, .identity = {}, .corpus = {}};
    if (const size_t colon = item.rfind(':'); colon != std::string::npos) {
      const std::string suffix = item.substr(colon + 1);
      char* stop = nullptr;
      const double w = std::strtod(suffix.c_str(), &stop);
      if (!suffix.empty() && stop == suffix.c_str() + suffix.size()) {
        HYDRA_USER_CHECK(std::isfinite(w) && w > 0, "{} {}: the weight {} must be a positive number", flag, item, suffix);
        source = DataSource{.path = item.substr(0, colon), .weight = w, .identity = {}, .corpus = {}};
      }
    }
    std::error_code ec;
    const bool manifest = source.path.size() > 5 && source.path.compare(source.path.size() - 5, 5, ".json") == 0;
    if (std::filesystem::is_directory(source.path, ec) || manifest) {
      for (const std::string& shard : corpus_shards(source.path, flag)) {
        out.push_back(DataSource{.path = shard, .weight = source.weight, .identity = {}, .corpus = source.path});
      }
      continue;
    }
    source.corpus = source.path;
    out.push_back(source);
  }
  return out;
}

std::vector<std::pair<std::string, std::vector<std::string>>> corpora_of(const std::vector<DataSource>& sources) {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const DataSource& s : sources) {
    const std::string& name = s.corpus.empty() ? s.path : s.corpus;
    if (out.empty() || out.back().first != name) out.emplace_back(name, std::vector<std::string>{});
    out.back().second.push_back(s.path);
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
  // Corpora: runs of consecutive sources with one name (a file alone is its own corpus).
  std::vector<double> corpus_weight;
  for (size_t f = 0; f < sources.size(); ++f) {
    const std::string& name = sources[f].corpus.empty() ? sources[f].path : sources[f].corpus;
    if (corpus_names_.empty() || corpus_names_.back() != name) {
      HYDRA_USER_CHECK(std::find(corpus_names_.begin(), corpus_names_.end(), name) == corpus_names_.end(),
                       "the corpus {} is given twice", name);
      corpus_names_.push_back(name);
      corpus_first_.push_back(first_window_[f]);
      corpus_weight.push_back(sources[f].weight);
    }
  }
  corpus_first_.push_back(windows_);
  double given = 0, unweighted_windows = 0;
  bool any = false, all = true;
  for (size_t c = 0; c < corpus_names_.size(); ++c) {
    if (corpus_weight[c] > 0) {
      given += corpus_weight[c];
      any = true;
    } else {
      all = false;
      unweighted_windows += static_cast<double>(corpus_first_[c + 1] - corpus_first_[c]);
    }
  }
  if (!any) return;  // pooled
  HYDRA_USER_CHECK(all || given < 1, "the weights given sum to {}, leaving nothing for the corpora without one (they "
                   "share 1 − the sum, in proportion to their windows)", given);
  for (size_t c = 0; c < corpus_names_.size(); ++c) {
    const double windows = static_cast<double>(corpus_first_[c + 1] - corpus_first_[c]);
    weights_.push_back(corpus_weight[c] > 0 ? (all ? corpus_weight[c] / given : corpus_weight[c])
                                            : (1 - given) * windows / unweighted_windows);
  }
  drawn_.assign(corpus_names_.size(), 0);
  corpus_epoch_.assign(corpus_names_.size(), -1);
  corpus_order_.resize(corpus_names_.size());
}

int64_t TokenWindows::corpus_window(int64_t c, int64_t k) const {
  const size_t ci = static_cast<size_t>(c);
  const int64_t n = corpus_first_[ci + 1] - corpus_first_[ci], epoch = k / n, i = k % n;
  if (!shuffle_) return corpus_first_[ci] + i;
  if (corpus_epoch_[ci] != epoch) {  // Fisher-Yates from (seed, corpus, epoch), as the pooled order
    std::vector<int64_t>& order = corpus_order_[ci];
    order.resize(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), int64_t{0});
    const RandomStream rng{seed_, hash_name("blend-order") + static_cast<uint64_t>(c) * 0x9E3779B97F4A7C15ull +
                                      static_cast<uint64_t>(epoch)};
    for (int64_t j = n - 1; j > 0; --j) {
      const int64_t r = static_cast<int64_t>(rng.bits(static_cast<uint64_t>(j)) % static_cast<uint64_t>(j + 1));
      std::swap(order[static_cast<size_t>(j)], order[static_cast<size_t>(r)]);
    }
    corpus_epoch_[ci] = epoch;
  }
  return corpus_first_[ci] + corpus_order_[ci][static_cast<size_t>(i)];
}

int64_t TokenWindows::corpus_of(int64_t i) const {
  return static_cast<int64_t>(std::upper_bound(corpus_first_.begin(), corpus_first_.end(), i) - corpus_first_.begin()) - 1;
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
    recent_.push_back(corpus_window(static_cast<int64_t>(best), drawn_[best]));
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
  for (int64_t j = n; j < cursor_; ++j) --counts[static_cast<size_t>(corpus_of(recent_[static_cast<size_t>(j - base_)]))];
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
