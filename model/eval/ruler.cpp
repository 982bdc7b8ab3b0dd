#include "model/eval/ruler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace hydra::niah {
namespace {

int64_t word_slot(const TaskParams& p) { return p.key_length + 1; }  // a word and the SEP after it

int64_t query_length(const TaskParams& p) {
  switch (p.task) {
    case Task::multiquery: return 2 + p.queries * p.key_length + (p.queries - 1);
    case Task::vartrack: return 2 + p.value_length_max;
    default: return 2;  // QUERY IS
  }
}

// `count` distinct sequences of `length` content ids, none in `avoid`, drawn by rejection.
std::vector<std::vector<int32_t>> distinct_words(Draws& draw, int64_t count, int64_t length, int64_t content,
                                                 const std::vector<std::vector<int32_t>>& avoid = {}) {
  std::vector<std::vector<int32_t>> out;
  while (static_cast<int64_t>(out.size()) < count) {
    std::vector<int32_t> w = draw.tokens(length, content);
    if (std::find(out.begin(), out.end(), w) == out.end() && std::find(avoid.begin(), avoid.end(), w) == avoid.end()) {
      out.push_back(std::move(w));
    }
  }
  return out;
}

// Appends items joined by SEP.
void append_items(std::vector<int32_t>& ids, const std::vector<std::vector<int32_t>>& items, int32_t sep) {
  for (size_t k = 0; k < items.size(); ++k) {
    if (k > 0) ids.push_back(sep);
    ids.insert(ids.end(), items[k].begin(), items[k].end());
  }
}

// A statement NEEDLE key IS value END.
std::vector<int32_t> statement(const Markers& m, const std::vector<int32_t>& key, const std::vector<int32_t>& value) {
  std::vector<int32_t> out{m.needle};
  out.insert(out.end(), key.begin(), key.end());
  out.push_back(m.is);
  out.insert(out.end(), value.begin(), value.end());
  out.push_back(m.end);
  return out;
}

// Statements placed in filler: statement j goes after point[j] filler tokens; context order by
// (point, rank[j]); returns the sample's ids so far and sets each needle's position.
void place(Sample& s, const Markers& m, const RandomStream& filler, int64_t fill, const std::vector<int64_t>& point,
           const std::vector<std::pair<int64_t, int64_t>>& rank, const std::vector<std::vector<int32_t>>& statements) {
  std::vector<size_t> order(statements.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return std::tuple(point[x], rank[x]) < std::tuple(point[y], rank[y]);
  });
  int64_t filled = 0;
  const auto filler_until = [&](int64_t until) {
    for (; filled < until; ++filled) {
      s.ids.push_back(static_cast<int32_t>(filler.bits(static_cast<uint64_t>(filled)) % static_cast<uint64_t>(m.content)));
    }
  };
  for (size_t j : order) {
    filler_until(point[j]);
    s.needles[j].position = static_cast<int64_t>(s.ids.size());
    s.ids.insert(s.ids.end(), statements[j].begin(), statements[j].end());
  }
  filler_until(fill);
}

int64_t depth_point(int64_t depth, int64_t fill) { return (2 * depth * fill + 100) / 200; }  // round(depth·F/100)

Sample multiquery(const TaskParams& p, const Markers& m, Draws& draw, const RandomStream& filler, Sample s) {
  const int64_t q = p.queries;
  auto [keys, values] = draw_keys_and_values(draw, p, q, q, m.content);
  std::vector<std::vector<int32_t>> statements;
  int64_t needles_total = 0, answer_length = q - 1;
  for (int64_t j = 0; j < q; ++j) {
    s.needles.push_back(Needle{.position = 0, .key = keys[static_cast<size_t>(j)], .value = values[static_cast<size_t>(j)]});
    statements.push_back(statement(m, keys[static_cast<size_t>(j)], values[static_cast<size_t>(j)]));
    needles_total += static_cast<int64_t>(statements.back().size());
    answer_length += static_cast<int64_t>(values[static_cast<size_t>(j)].size());
  }
  const int64_t fill = s.length - query_length(p) - answer_length - needles_total;
  HYDRA_ASSERT(fill >= 0, "multiquery: min_length admitted length {} without room", s.length);
  // The first queried needle at the depth, the others uniform (ties: as NIAH's primary needle).
  std::vector<int64_t> point(static_cast<size_t>(q));
  std::vector<std::pair<int64_t, int64_t>> rank(static_cast<size_t>(q));
  point[0] = depth_point(s.depth, fill);
  rank[0] = {s.depth <= 50 ? -1 : 1, 0};
  for (int64_t j = 1; j < q; ++j) {
    point[static_cast<size_t>(j)] = static_cast<int64_t>(draw.below(static_cast<uint64_t>(fill + 1)));
    rank[static_cast<size_t>(j)] = {0, j};
  }
  place(s, m, filler, fill, point, rank, statements);
  s.ids.push_back(m.query);
  append_items(s.ids, keys, m.sep);
  s.ids.push_back(m.is);
  s.answer_start = static_cast<int64_t>(s.ids.size());
  append_items(s.ids, values, m.sep);
  s.answer_length = answer_length;
  s.key = keys[0];
  s.needle_position = s.needles[0].position;
  return s;
}

Sample vartrack(const TaskParams& p, const Markers& m, Draws& draw, const RandomStream& filler, Sample s) {
  const int64_t per_chain = p.hops + 1, vars = p.chains * per_chain;
  // Variables first, then chain values that are never a variable (a value of key_length ids could be).
  const std::vector<std::vector<int32_t>> var = distinct_words(draw, vars, p.key_length, m.content);
  std::vector<std::vector<int32_t>> value;
  const uint64_t spread = static_cast<uint64_t>(p.value_length_max - p.value_length_min + 1);
  while (static_cast<int64_t>(value.size()) < p.chains) {
    const int64_t len = p.value_length_min + static_cast<int64_t>(draw.below(spread));
    std::vector<int32_t> v = draw.tokens(len, m.content);
    if (std::find(value.begin(), value.end(), v) == value.end() && std::find(var.begin(), var.end(), v) == var.end()) {
      value.push_back(std::move(v));
    }
  }
  std::vector<std::vector<int32_t>> statements;
  int64_t total = 0;
  for (int64_t c = 0; c < p.chains; ++c) {
    for (int64_t h = 0; h < per_chain; ++h) {
      const std::vector<int32_t>& x = var[static_cast<size_t>(c * per_chain + h)];
      const std::vector<int32_t>& rhs = h == 0 ? value[static_cast<size_t>(c)] : var[static_cast<size_t>(c * per_chain + h - 1)];
      s.needles.push_back(Needle{.position = 0, .key = x, .value = rhs});
      statements.push_back(statement(m, x, rhs));
      total += static_cast<int64_t>(statements.back().size());
    }
  }
  const int64_t answer_length = per_chain * p.key_length + p.hops;
  const int64_t fill = s.length - 2 - static_cast<int64_t>(value[0].size()) - answer_length - total;
  HYDRA_ASSERT(fill >= 0, "vartrack: min_length admitted length {} without room", s.length);
  // Chain 0 starts at the depth and its hops follow it; other chains anywhere, each in order.
  std::vector<int64_t> point;
  std::vector<std::pair<int64_t, int64_t>> rank;
  for (int64_t c = 0; c < p.chains; ++c) {
    const int64_t lo = c == 0 ? depth_point(s.depth, fill) : 0;
    std::vector<int64_t> pts{lo};
    if (c > 0) pts[0] = lo + static_cast<int64_t>(draw.below(static_cast<uint64_t>(fill - lo + 1)));
    for (int64_t h = 1; h < per_chain; ++h) pts.push_back(lo + static_cast<int64_t>(draw.below(static_cast<uint64_t>(fill - lo + 1))));
    std::sort(pts.begin() + (c == 0 ? 1 : 0), pts.end());
    for (int64_t h = 0; h < per_chain; ++h) {
      point.push_back(pts[static_cast<size_t>(h)]);
      rank.emplace_back(c, h);  // at one point: chain order, then hop order
    }
  }
  place(s, m, filler, fill, point, rank, statements);
  s.ids.push_back(m.query);
  s.ids.insert(s.ids.end(), value[0].begin(), value[0].end());
  s.ids.push_back(m.is);
  s.answer_start = static_cast<int64_t>(s.ids.size());
  append_items(s.ids, std::vector<std::vector<int32_t>>(var.begin(), var.begin() + per_chain), m.sep);
  s.answer_length = answer_length;
  s.key = value[0];
  s.needle_position = s.needles[0].position;
  return s;
}

// The word list of cwe/fwe: `pad` END markers, then each occurrence's word and a SEP.
void word_list(Sample& s, const Markers& m, int64_t pad, const std::vector<std::vector<int32_t>>& words,
               const std::vector<int64_t>& occurrences) {
  s.ids.assign(static_cast<size_t>(pad), m.end);
  for (int64_t w : occurrences) {
    s.ids.insert(s.ids.end(), words[static_cast<size_t>(w)].begin(), words[static_cast<size_t>(w)].end());
    s.ids.push_back(m.sep);
  }
  s.ids.push_back(m.query);
  s.ids.push_back(m.is);
  s.answer_start = static_cast<int64_t>(s.ids.size());
}

Sample cwe(const TaskParams& p, const Markers& m, Draws& draw, Sample s) {
  const int64_t slot = word_slot(p), answer_length = p.common_words * slot - 1;
  const int64_t region = s.length - 2 - answer_length, common = p.common_words * p.common_freq * slot;
  const int64_t uncommon = (region - common) / (p.uncommon_freq * slot);
  const int64_t pad = region - common - uncommon * p.uncommon_freq * slot;
  const int64_t words_needed = p.common_words + uncommon;
  HYDRA_USER_CHECK(count_sequences(m.content, p.key_length) >= 2 * words_needed,
                   "cwe at length {}: {} distinct words of {} token(s) are needed, {} content ids give too few; use a "
                   "larger --key-length or a higher --uncommon-freq",
                   s.length, words_needed, p.key_length, m.content);
  const std::vector<std::vector<int32_t>> words = distinct_words(draw, words_needed, p.key_length, m.content);
  std::vector<int64_t> occurrences;
  for (int64_t w = 0; w < words_needed; ++w) {
    for (int64_t k = 0; k < (w < p.common_words ? p.common_freq : p.uncommon_freq); ++k) occurrences.push_back(w);
  }
  for (size_t i = occurrences.size(); i > 1; --i) std::swap(occurrences[i - 1], occurrences[draw.below(i)]);  // Fisher–Yates
  word_list(s, m, pad, words, occurrences);
  std::vector<std::vector<int32_t>> answer;  // the common words by first occurrence
  for (int64_t w : occurrences) {
    if (w < p.common_words && std::find(answer.begin(), answer.end(), words[static_cast<size_t>(w)]) == answer.end()) {
      answer.push_back(words[static_cast<size_t>(w)]);
    }
  }
  append_items(s.ids, answer, m.sep);
  s.answer_length = answer_length;
  return s;
}

Sample fwe(const TaskParams& p, const Markers& m, uint64_t seed, const std::string& cell_key, Draws& draw, Sample s) {
  const int64_t slot = word_slot(p), answer_length = p.top_words * slot - 1;
  const int64_t region = s.length - 2 - answer_length, n = region / slot, pad = region - n * slot;
  const int64_t distinct = p.fwe_words > 0 ? p.fwe_words : std::max(p.top_words + 1, n / 4);
  HYDRA_USER_CHECK(count_sequences(m.content, p.key_length) >= 2 * distinct,
                   "fwe at length {}: {} distinct words of {} token(s) are needed, {} content ids give too few; use a "
                   "larger --key-length or a smaller --fwe-words",
                   s.length, distinct, p.key_length, m.content);
  const std::vector<std::vector<int32_t>> words = distinct_words(draw, distinct, p.key_length, m.content);
  std::vector<double> cdf(static_cast<size_t>(distinct));  // Zipf over ranks 1..distinct
  double total = 0;
  for (int64_t r = 0; r < distinct; ++r) cdf[static_cast<size_t>(r)] = total += std::pow(static_cast<double>(r + 1), -p.zipf_alpha);
  for (int attempt = 0; attempt < 64; ++attempt) {
    Draws a(seed, hash_name(fmt::format("niah-fwe/{}/{}", cell_key, attempt)));
    std::vector<int64_t> occurrences, count(static_cast<size_t>(distinct), 0);
    for (int64_t i = 0; i < n; ++i) {
      const double u = static_cast<double>(a.below(uint64_t{1} << 53)) / static_cast<double>(uint64_t{1} << 53) * total;
      const int64_t w = std::min<int64_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin(), distinct - 1);
      occurrences.push_back(w);
      ++count[static_cast<size_t>(w)];
    }
    std::vector<int64_t> by_count(static_cast<size_t>(distinct));
    std::iota(by_count.begin(), by_count.end(), int64_t{0});
    std::stable_sort(by_count.begin(), by_count.end(),
                     [&](int64_t x, int64_t y) { return count[static_cast<size_t>(x)] > count[static_cast<size_t>(y)]; });
    bool strict = true;  // the top_words + 1 most frequent have distinct counts
    for (int64_t k = 0; k < p.top_words; ++k) {
      strict = strict && count[static_cast<size_t>(by_count[static_cast<size_t>(k)])] >
                             count[static_cast<size_t>(by_count[static_cast<size_t>(k + 1)])];
    }
    if (!strict) continue;
    word_list(s, m, pad, words, occurrences);
    std::vector<std::vector<int32_t>> answer;
    for (int64_t k = 0; k < p.top_words; ++k) answer.push_back(words[static_cast<size_t>(by_count[static_cast<size_t>(k)])]);
    append_items(s.ids, answer, m.sep);
    s.answer_length = answer_length;
    return s;
  }
  HYDRA_USER_FAIL("fwe at length {}: 64 draws gave no strict ranking of the {} most frequent words; use a longer length, "
                  "a higher --zipf-alpha or fewer --top-words",
                  s.length, p.top_words);
}

}  // namespace

bool task_has_depth(Task task) { return task != Task::cwe && task != Task::fwe; }

bool is_ruler_family(Task task) {
  return task == Task::multiquery || task == Task::vartrack || task == Task::cwe || task == Task::fwe;
}

const std::vector<Task>& ruler_suite_tasks() {
  static const std::vector<Task> tasks = {Task::single,     Task::multikey, Task::multivalue, Task::multiquery,
                                          Task::vartrack,   Task::cwe,      Task::fwe};
  return tasks;
}

SizedTask size_task_to_length(const TaskParams& given, int64_t length, const std::set<std::string>& fixed) {
  SizedTask out{given, {}};
  TaskParams& p = out.params;
  const auto set = [&](const char* flag, int64_t& knob, int64_t value) {
    if (fixed.count(flag) || knob == value) return false;
    out.changes.push_back(fmt::format("{} {} -> {}", flag, knob, value));
    knob = value;
    return true;
  };
  // A knob stepped down while the sample does not fit, not below `floor`.
  const auto shrink = [&](const char* flag, int64_t& knob, int64_t floor) {
    if (fixed.count(flag) || p.min_length() <= length || knob <= floor) return;
    const int64_t from = knob;
    while (knob > floor && p.min_length() > length) --knob;
    out.changes.push_back(fmt::format("{} {} -> {}", flag, from, knob));
  };
  switch (p.task) {
    case Task::cwe:
      if (length < 4096) {  // RULER's common_words_extraction below 4K: freq_cw 6, freq_ucw 1
        set("--common-freq", p.common_freq, 6);
        set("--uncommon-freq", p.uncommon_freq, 1);
      }
      shrink("--common-words", p.common_words, 1);
      shrink("--common-freq", p.common_freq, p.uncommon_freq + 1);
      break;
    case Task::fwe:
      set("--fwe-words", p.fwe_words, std::max(p.top_words + 1, length / 50));  // RULER: vocab_size = length / 50
      shrink("--top-words", p.top_words, 1);  // fewer top words keep --fwe-words above them
      break;
    case Task::multiquery: shrink("--queries", p.queries, 2); break;
    case Task::vartrack:
      shrink("--hops", p.hops, 1);
      shrink("--chains", p.chains, 1);
      break;
    case Task::multivalue: shrink("--values", p.values, 2); break;
    case Task::multikey: shrink("--distractors", p.distractors, 1); break;
    default: break;
  }
  return out;
}

int64_t ruler_max_answer_length(const TaskParams& p) {
  switch (p.task) {
    case Task::multiquery: return p.queries * p.value_length_max + p.queries - 1;
    case Task::vartrack: return (p.hops + 1) * p.key_length + p.hops;
    case Task::cwe: return p.common_words * word_slot(p) - 1;
    case Task::fwe: return p.top_words * word_slot(p) - 1;
    default: return 0;
  }
}

int64_t ruler_min_length(const TaskParams& p) {
  const int64_t tail = query_length(p) + ruler_max_answer_length(p);
  switch (p.task) {
    case Task::multiquery: return p.queries * p.needle_length(p.value_length_max) + tail;
    case Task::vartrack: return p.chains * (p.needle_length(p.value_length_max) + p.hops * (3 + 2 * p.key_length)) + tail;
    case Task::cwe: return (p.common_words * p.common_freq + p.uncommon_freq) * word_slot(p) + tail;
    case Task::fwe: return 16 * (p.top_words + 1) * word_slot(p) + tail;
    default: return 0;
  }
}

void ruler_validate(const TaskParams& p, const Markers& m) {
  const std::string name = task_name(p.task);
  switch (p.task) {
    case Task::multiquery:
      HYDRA_USER_CHECK(p.queries >= 2, "multiquery needs at least 2 queries (got {})", p.queries);
      break;
    case Task::vartrack:
      HYDRA_USER_CHECK(p.chains >= 1 && p.hops >= 1, "vartrack needs at least 1 chain of at least 1 hop (got {} of {})",
                       p.chains, p.hops);
      break;
    case Task::cwe:
      HYDRA_USER_CHECK(p.common_words >= 1 && p.uncommon_freq >= 1 && p.common_freq > p.uncommon_freq,
                       "cwe needs at least 1 common word and --common-freq above --uncommon-freq >= 1 (got {} words, "
                       "frequencies {} and {})",
                       p.common_words, p.common_freq, p.uncommon_freq);
      break;
    case Task::fwe:
      HYDRA_USER_CHECK(p.top_words >= 1, "fwe needs at least 1 top word (got {})", p.top_words);
      HYDRA_USER_CHECK(std::isfinite(p.zipf_alpha) && p.zipf_alpha > 0, "fwe: --zipf-alpha must be positive (got {})",
                       p.zipf_alpha);
      HYDRA_USER_CHECK(p.fwe_words == 0 || p.fwe_words > p.top_words,
                       "fwe: --fwe-words {} must exceed --top-words {} (0: a quarter of the occurrences)", p.fwe_words,
                       p.top_words);
      break;
    default: break;
  }
  const int64_t keys = p.task == Task::multiquery ? p.queries
                       : p.task == Task::vartrack ? p.chains * (p.hops + 1)
                       : p.task == Task::cwe      ? p.common_words + 1
                                                  : p.top_words + 1;
  HYDRA_USER_CHECK(count_sequences(m.content, p.key_length) >= 2 * keys,
                   "{} content tokens are too few to draw {} distinct {} of {} tokens for task {}", m.content, keys,
                   p.task == Task::multiquery || p.task == Task::vartrack ? "keys" : "words", p.key_length, name);
}

Sample generate_ruler_sample(const TaskParams& p, const Markers& m, uint64_t seed, int64_t length, int64_t depth,
                             int64_t index) {
  const std::string cell_key = fmt::format("{}/{}/{}", task_name(p.task), length, index);
  Draws draw(seed, hash_name("niah/" + cell_key));
  const RandomStream filler{seed, hash_name("niah-filler/" + cell_key)};
  Sample s;
  s.length = length;
  s.depth = depth;
  s.index = index;
  switch (p.task) {
    case Task::multiquery: s = multiquery(p, m, draw, filler, std::move(s)); break;
    case Task::vartrack: s = vartrack(p, m, draw, filler, std::move(s)); break;
    case Task::cwe: s = cwe(p, m, draw, std::move(s)); break;
    case Task::fwe: s = fwe(p, m, seed, cell_key, draw, std::move(s)); break;
    default: HYDRA_ASSERT(false, "task {} is not a RULER family task", task_name(p.task));
  }
  HYDRA_ASSERT(static_cast<int64_t>(s.ids.size()) == length && s.answer_start + s.answer_length == length,
               "{} sample of {} tokens, answer at {}+{}, for length {}", task_name(p.task), s.ids.size(), s.answer_start,
               s.answer_length, length);
  return s;
}

}  // namespace hydra::niah
