// Calibration prompts and plain text for head selection; the rules are in head_calibration.h.
#include "model/selection/head_calibration.h"

#include <algorithm>

#include "runtime/random.h"

namespace hydra::heads {
namespace {

// Positions where `pattern` occurs inside ids[0, end), left to right, non-overlapping.
std::vector<int64_t> occurrences(const std::vector<int32_t>& ids, int64_t end, std::span<const int32_t> pattern) {
  std::vector<int64_t> at;
  const int64_t n = static_cast<int64_t>(pattern.size());
  for (int64_t p = 0; p + n <= end;) {
    if (std::equal(pattern.begin(), pattern.end(), ids.begin() + p)) {
      at.push_back(p);
      p += n;
    } else {
      ++p;
    }
  }
  return at;
}

}  // namespace

CalibrationPrompt corrupt_generated(const niah::Sample& sample, int64_t vocab_size, uint64_t seed) {
  HYDRA_ASSERT(!sample.needles.empty() && !sample.key.empty(), "corrupt_generated needs a generated sample");
  const niah::Markers m = niah::markers_for(vocab_size);
  const int64_t key_length = static_cast<int64_t>(sample.key.size());
  CalibrationPrompt p;
  p.clean = sample.ids;
  p.corrupted = sample.ids;
  p.answer_start = sample.answer_start;
  p.answer_length = sample.answer_length;
  p.patch_start = sample.answer_start - 2 - key_length;
  HYDRA_ASSERT(p.patch_start >= 0 && p.clean[static_cast<size_t>(p.patch_start)] == m.query,
               "no QUERY marker at {} (answer at {})", p.patch_start, p.answer_start);
  // The needles that state the queried key's value(s), in context order.
  std::vector<const niah::Needle*> queried;
  for (const niah::Needle& n : sample.needles) {
    if (n.key == sample.key) queried.push_back(&n);
  }
  std::sort(queried.begin(), queried.end(), [](const niah::Needle* x, const niah::Needle* y) { return x->position < y->position; });
  const RandomStream rng{seed, hash_name(fmt::format("select-heads/corrupt/{}/{}/{}", sample.length, sample.depth, sample.index))};
  const uint64_t content = static_cast<uint64_t>(m.content);
  uint64_t drawn = 0;
  std::vector<int32_t> clean_answer;
  for (const niah::Needle* n : queried) {
    if (!clean_answer.empty()) {
      clean_answer.push_back(m.sep);
      p.corrupted_answer.push_back(m.sep);
    }
    const int64_t value_at = n->position + 2 + key_length;  // NEEDLE key IS value END
    for (size_t k = 0; k < n->value.size(); ++k) {
      const int32_t v = n->value[k];
      const auto u = rng.bits(drawn++) % (content - 1);
      const auto replaced = static_cast<int32_t>((static_cast<uint64_t>(v) + 1 + u) % content);
      HYDRA_ASSERT(p.clean[static_cast<size_t>(value_at) + k] == v, "needle value not at {}", value_at);
      p.corrupted[static_cast<size_t>(value_at) + k] = replaced;
      clean_answer.push_back(v);
      p.corrupted_answer.push_back(replaced);
    }
    HYDRA_ASSERT(value_at + static_cast<int64_t>(n->value.size()) <= p.patch_start, "needle after the query");
  }
  const std::span<const int32_t> answer = p.answer();
  HYDRA_ASSERT(std::equal(answer.begin(), answer.end(), clean_answer.begin(), clean_answer.end()),
               "the answer is not the queried needles' values ({} vs {} tokens)", answer.size(), clean_answer.size());
  return p;
}

CalibrationPrompt corrupt_with_donor(const niah::Sample& sample, std::span<const int32_t> donor, const std::string& where) {
  const std::span<const int32_t> answer = sample.answer();
  HYDRA_ASSERT(donor.size() == answer.size() && !std::equal(donor.begin(), donor.end(), answer.begin()),
               "a donor answer must have the same length and differ");
  CalibrationPrompt p;
  p.clean = sample.ids;
  p.corrupted = sample.ids;
  p.answer_start = sample.answer_start;
  p.answer_length = sample.answer_length;
  p.patch_start = sample.answer_start - 1;
  p.corrupted_answer.assign(donor.begin(), donor.end());
  const std::vector<int64_t> at = occurrences(p.clean, p.patch_start, answer);
  HYDRA_USER_CHECK(!at.empty(),
                   "{}: the answer's {} tokens do not occur in the context before position {}, so no corrupted prompt "
                   "can be made (head selection changes the needle value where the answer occurs; the set's answer "
                   "must be tokenized like the needle's value)",
                   where, answer.size(), p.patch_start);
  for (int64_t pos : at) std::copy(donor.begin(), donor.end(), p.corrupted.begin() + pos);
  return p;
}

std::vector<CalibrationPrompt> generated_prompts(const niah::TaskParams& params, int64_t vocab_size, uint64_t seed,
                                                 int64_t length, int64_t count) {
  HYDRA_USER_CHECK(count >= 1, "head selection needs at least 1 calibration prompt (got {})", count);
  std::vector<CalibrationPrompt> out;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t depth = count == 1 ? 50 : (200 * i + (count - 1)) / (2 * (count - 1));  // round(100·i/(count−1))
    out.push_back(corrupt_generated(niah::generate_sample(params, vocab_size, seed, length, depth, i), vocab_size, seed));
  }
  return out;
}

std::vector<CalibrationPrompt> eval_set_prompts(const niah::EvalSet& set, const std::string& source) {
  HYDRA_USER_CHECK(!set.samples.empty(), "{}: the eval set holds no samples", source);
  std::vector<CalibrationPrompt> out;
  const size_t n = set.samples.size();
  for (size_t i = 0; i < n; ++i) {
    const niah::Sample& s = set.samples[i];
    const std::span<const int32_t> answer = s.answer();
    const niah::Sample* donor = nullptr;
    for (size_t k = 1; k < n && !donor; ++k) {
      const niah::Sample& c = set.samples[(i + k) % n];
      const std::span<const int32_t> other = c.answer();
      if (other.size() == answer.size() && !std::equal(other.begin(), other.end(), answer.begin())) donor = &c;
    }
    HYDRA_USER_CHECK(donor, "{}: sample {}: no other sample has a different answer of {} tokens to serve as its corrupted "
                            "value (head selection needs two distinct answers of every answer length)",
                     source, i, answer.size());
    out.push_back(corrupt_with_donor(s, donor->answer(), fmt::format("{}: sample {}", source, i)));
  }
  return out;
}

std::vector<std::vector<int32_t>> random_text(int64_t vocab_size, uint64_t seed, int64_t length, int64_t count) {
  std::vector<std::vector<int32_t>> out;
  for (int64_t i = 0; i < count; ++i) {
    const RandomStream rng{seed, hash_name(fmt::format("select-heads/lm/{}", i))};
    std::vector<int32_t> ids(static_cast<size_t>(length));
    for (int64_t t = 0; t < length; ++t) {
      ids[static_cast<size_t>(t)] = static_cast<int32_t>(rng.bits(static_cast<uint64_t>(t)) % static_cast<uint64_t>(vocab_size));
    }
    out.push_back(std::move(ids));
  }
  return out;
}

std::vector<std::vector<int32_t>> text_windows(const std::vector<int32_t>& tokens, int64_t length, int64_t count,
                                               const std::string& source) {
  HYDRA_USER_CHECK(static_cast<int64_t>(tokens.size()) >= length * count,
                   "{}: holds {} tokens; {} plain-text sequences of {} tokens need {}", source, tokens.size(), count,
                   length, length * count);
  std::vector<std::vector<int32_t>> out;
  for (int64_t i = 0; i < count; ++i) out.emplace_back(tokens.begin() + i * length, tokens.begin() + (i + 1) * length);
  return out;
}

}  // namespace hydra::heads
