#include "parallel/layout.h"

#include <algorithm>

#include "parallel/communicator.h"
#include "runtime/error.h"

namespace hydra {

void SequenceLayout::check_length(int64_t total_length, int world_size) {
  HYDRA_USER_CHECK(total_length > 0, "sequence length must be positive (got {})", total_length);
  const int64_t g = granularity(world_size);
  if (total_length % g != 0) {
    const int64_t below = total_length / g * g, above = below + g;
    HYDRA_USER_FAIL("sequence length {} is not divisible by 2P = {} (zigzag layout over P = {} ranks); "
                    "use a multiple of {}, e.g. {}{}",
                    total_length, g, world_size, g, below > 0 ? std::to_string(below) + " or " : "", above);
  }
}

SequenceLayout group_layout(const Communicator& group, int64_t total_length, std::vector<int64_t> document_starts) {
  return SequenceLayout::zigzag(total_length, group.size(), group.rank(), std::move(document_starts));
}

SequenceLayout SequenceLayout::zigzag(int64_t total_length, int world_size, int rank,
                                     std::vector<int64_t> document_starts) {
  HYDRA_ASSERT(world_size >= 1 && rank >= 0 && rank < world_size, "rank {} of {}", rank, world_size);
  check_length(total_length, world_size);
  SequenceLayout layout;
  layout.total_ = total_length;
  layout.world_ = world_size;
  layout.rank_ = rank;
  layout.local_ = layout.segments_of(rank);
  if (document_starts.size() > 1) {  // a single document is no document structure at all
    HYDRA_ASSERT(document_starts.front() == 0 && document_starts.back() < total_length &&
                     std::adjacent_find(document_starts.begin(), document_starts.end(),
                                        [](int64_t a, int64_t b) { return a >= b; }) == document_starts.end(),
                 "document starts must be 0 = s_0 < s_1 < ... < {} (got {} starts)", total_length, document_starts.size());
    layout.doc_starts_ = std::move(document_starts);
  }
  return layout;
}

SequenceLayout SequenceLayout::with_document_bounds() const {
  SequenceLayout out = *this;
  if (out.doc_starts_.empty()) out.doc_starts_ = {0};
  return out;
}

int64_t SequenceLayout::document_start(int64_t pos) const {
  if (doc_starts_.empty()) return 0;
  return *(std::upper_bound(doc_starts_.begin(), doc_starts_.end(), pos) - 1);
}

int64_t SequenceLayout::document_end(int64_t pos) const {
  if (doc_starts_.empty()) return total_;
  const auto next = std::upper_bound(doc_starts_.begin(), doc_starts_.end(), pos);
  return next == doc_starts_.end() ? total_ : *next;
}

std::vector<int64_t> SequenceLayout::local_document_starts() const {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(local_length()));
  for (const Segment& s : local_) {
    for (int64_t i = 0; i < s.length; ++i) out.push_back(document_start(s.start + i));
  }
  return out;
}

std::vector<int64_t> SequenceLayout::local_document_positions() const {
  std::vector<int64_t> out = local_positions();
  const std::vector<int64_t> starts = local_document_starts();
  for (size_t i = 0; i < out.size(); ++i) out[i] -= starts[i];
  return out;
}

std::vector<int64_t> SequenceLayout::starts_inside(int64_t begin, int64_t end) const {
  std::vector<int64_t> out;
  for (auto it = std::upper_bound(doc_starts_.begin(), doc_starts_.end(), begin); it != doc_starts_.end() && *it < end; ++it) {
    out.push_back(*it);
  }
  return out;
}

std::vector<Segment> SequenceLayout::segments_of(int r) const {
  const int64_t len = segment_length();
  if (world_ == 1) return {Segment{0, 0, total_, 0}};
  const int first = r, second = 2 * world_ - 1 - r;
  return {Segment{first, first * len, len, 0}, Segment{second, second * len, len, len}};
}

int SequenceLayout::owner_of(int segment) const {
  if (world_ == 1) return 0;
  return segment < world_ ? segment : 2 * world_ - 1 - segment;
}

std::vector<int64_t> SequenceLayout::local_positions() const {
  std::vector<int64_t> positions;
  positions.reserve(static_cast<size_t>(local_length()));
  for (const Segment& s : local_) {
    for (int64_t i = 0; i < s.length; ++i) positions.push_back(s.start + i);
  }
  return positions;
}

Tensor SequenceLayout::local_rows(const TensorView& global) const {
  HYDRA_ASSERT(global.rank() >= 1 && global.size(0) == total_, "local_rows of a [{}, ...] tensor in a layout of {} tokens",
               global.rank() >= 1 ? global.size(0) : 0, total_);
  std::vector<int64_t> shape(global.shape().begin(), global.shape().end());
  shape[0] = local_length();
  Tensor out = Tensor::empty(shape, global.dtype(), global.device());
  for (const Segment& s : local_) copy_into(out.view().narrow(0, s.local_offset, s.length), global.narrow(0, s.start, s.length));
  return out;
}

TokenRows SequenceLayout::token_rows(std::span<const int32_t> tokens, const TargetFlags& flags) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  HYDRA_ASSERT(n == total_ || n == total_ + 1, "token_rows of {} tokens in a layout of {}", n, total_);
  HYDRA_ASSERT((flags.counted.empty() || static_cast<int64_t>(flags.counted.size()) == n) &&
                   (flags.answer.empty() || static_cast<int64_t>(flags.answer.size()) == n),
               "token_rows: flags for {} / {} of {} tokens", flags.counted.size(), flags.answer.size(), n);
  TokenRows rows{Tensor::empty({local_length()}, DType::i32), Tensor::empty({local_length()}, DType::i32), {}};
  if (!flags.answer.empty()) rows.answer.assign(static_cast<size_t>(local_length()), 0);
  int32_t* ids = rows.ids.data_as<int32_t>();
  int32_t* targets = rows.targets.data_as<int32_t>();
  for (const Segment& s : local_) {
    for (int64_t i = 0; i < s.length; ++i) {
      const int64_t g = s.start + i, row = s.local_offset + i;
      const size_t next = static_cast<size_t>(g + 1);
      const bool counted = g + 1 < n && (flags.counted.empty() || flags.counted[next] != 0);
      ids[row] = tokens[static_cast<size_t>(g)];
      targets[row] = counted ? tokens[next] : -1;
      if (!rows.answer.empty() && g + 1 < n) rows.answer[static_cast<size_t>(row)] = flags.answer[next];
    }
  }
  return rows;
}

TokenRows SequenceLayout::rows_of(std::span<const int32_t> ids, std::span<const int32_t> targets,
                                  std::span<const uint8_t> answer) const {
  HYDRA_ASSERT(static_cast<int64_t>(ids.size()) == total_ && targets.size() == ids.size() &&
                   (answer.empty() || answer.size() == ids.size()),
               "rows_of: {} ids, {} targets, {} answer flags in a layout of {}", ids.size(), targets.size(), answer.size(),
               total_);
  TokenRows rows{Tensor::empty({local_length()}, DType::i32), Tensor::empty({local_length()}, DType::i32), {}};
  if (!answer.empty()) rows.answer.assign(static_cast<size_t>(local_length()), 0);
  for (const Segment& s : local_) {
    for (int64_t i = 0; i < s.length; ++i) {
      const size_t g = static_cast<size_t>(s.start + i);
      const int64_t row = s.local_offset + i;
      rows.ids.data_as<int32_t>()[row] = ids[g];
      rows.targets.data_as<int32_t>()[row] = targets[g];
      if (!answer.empty()) rows.answer[static_cast<size_t>(row)] = answer[g];
    }
  }
  return rows;
}

void SequenceLayout::place_local_rows(const TensorView& global, const TensorView& local) const {
  HYDRA_ASSERT(global.rank() >= 1 && global.size(0) == total_ && local.rank() == global.rank() &&
                   local.size(0) == local_length(),
               "place_local_rows: global {} / local {} in a layout of {} tokens ({} local)", global.shape_string(),
               local.shape_string(), total_, local_length());
  for (const Segment& s : local_) copy_into(global.narrow(0, s.start, s.length), local.narrow(0, s.local_offset, s.length));
}

std::vector<uint8_t> counted_within_documents(std::span<const uint8_t> counted, int64_t n,
                                              std::span<const int64_t> starts) {
  std::vector<uint8_t> out = counted.empty() ? std::vector<uint8_t>(static_cast<size_t>(n), 1)
                                             : std::vector<uint8_t>(counted.begin(), counted.end());
  HYDRA_ASSERT(static_cast<int64_t>(out.size()) == n, "loss mask of {} for {} tokens", out.size(), n);
  for (int64_t s : starts) {
    HYDRA_ASSERT(s >= 0 && s < n, "document start {} outside [0, {})", s, n);
    if (s > 0) out[static_cast<size_t>(s)] = 0;
  }
  return out;
}

}  // namespace hydra
