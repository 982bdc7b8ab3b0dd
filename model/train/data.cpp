#include "model/train/data.h"

#include <algorithm>
#include <numeric>
#include <type_traits>

#include "runtime/error.h"
#include "runtime/random.h"
#include "runtime/token_file.h"

namespace hydra::train {

TokenWindows::TokenWindows(const std::vector<std::string>& files, int64_t seq_len, uint64_t seed, int64_t vocab)
    : seq_len_(seq_len), seed_(seed) {
  HYDRA_USER_CHECK(!files.empty(), "no training data files given");
  HYDRA_USER_CHECK(seq_len >= 1, "--seq-len must be at least 1 (got {})", seq_len);
  for (const std::string& path : files) {
    streams_.push_back(read_token_data(path, vocab));
    const TokenData& s = streams_.back();
    const int64_t n = static_cast<int64_t>(s.ids.size());
    HYDRA_USER_CHECK(n >= seq_len + 1, "{}: holds {} tokens, shorter than one window of --seq-len {} + 1 (its targets)",
                     path, n, seq_len);
    for (int64_t off = 0; off + seq_len + 1 <= n; off += seq_len) {
      starts_.push_back(Start{static_cast<int32_t>(streams_.size() - 1), off, 0});
      const Window w = window_in_order(count() - 1);
      starts_.back().counted = w.counted.empty() ? seq_len : std::count(w.counted.begin() + 1, w.counted.end(), 1);
    }
  }
}

int64_t TokenWindows::tokens() const {
  int64_t n = 0;
  for (const auto& s : streams_) n += static_cast<int64_t>(s.ids.size());
  return n;
}

bool TokenWindows::masked() const {
  return std::any_of(streams_.begin(), streams_.end(), [](const TokenData& s) { return !s.loss_mask.empty(); });
}

int64_t TokenWindows::index_in_epoch(int64_t epoch, int64_t i) const {
  if (epoch != cached_epoch_) {  // Fisher-Yates from (seed, epoch): the same order on every rank and run
    order_.resize(starts_.size());
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

Window TokenWindows::window_in_order(int64_t i) const {
  HYDRA_ASSERT(i >= 0 && i < count(), "window {} of {}", i, count());
  const Start& s = starts_[static_cast<size_t>(i)];
  const TokenData& stream = streams_[static_cast<size_t>(s.file)];
  const auto slice = [&](const auto& v) {
    using V = std::decay_t<decltype(v)>;
    return v.empty() ? V{} : V(v.begin() + s.offset, v.begin() + s.offset + seq_len_ + 1);
  };
  Window w{slice(stream.ids), slice(stream.loss_mask), slice(stream.answer), {}};
  if (!stream.document_offsets.empty()) {
    // Boundaries in (offset, offset + seq_len]: the last one is the extra target's, which then starts
    // the next document: its target does not count (nor does any other crossing one).
    std::vector<int64_t> inside;
    const auto& o = stream.document_offsets;
    for (auto it = std::upper_bound(o.begin(), o.end(), s.offset); it != o.end() && *it <= s.offset + seq_len_; ++it) {
      inside.push_back(*it - s.offset);
    }
    if (!inside.empty()) {
      w.counted = counted_within_documents(w.counted, seq_len_ + 1, inside);
      w.document_starts.push_back(0);
      for (int64_t b : inside)
        if (b < seq_len_) w.document_starts.push_back(b);
      if (w.document_starts.size() == 1) w.document_starts.clear();
    }
  }
  return w;
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

Window TokenWindows::window(int64_t n) const {
  HYDRA_ASSERT(n >= 0, "window {}", n);
  return window_in_order(index_in_epoch(n / count(), n % count()));
}

int64_t TokenWindows::counted_targets_in_order(int64_t i) const {
  HYDRA_ASSERT(i >= 0 && i < count(), "window {} of {}", i, count());
  return starts_[static_cast<size_t>(i)].counted;
}

int64_t TokenWindows::counted_targets(int64_t n) const {
  HYDRA_ASSERT(n >= 0, "window {}", n);
  return counted_targets_in_order(index_in_epoch(n / count(), n % count()));
}

}  // namespace hydra::train
