#include "model/eval/niah.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "model/eval/ruler.h"
#include "model/generate.h"
#include "runtime/random.h"

namespace hydra::niah {

int64_t count_sequences(int64_t content, int64_t power) {
  int64_t n = 1;
  for (int64_t i = 0; i < power && n < (int64_t{1} << 40); ++i) n *= content;
  return n;
}

namespace {

template <class T>
bool contains(const std::vector<T>& list, const T& x) {
  return std::find(list.begin(), list.end(), x) != list.end();
}

}  // namespace

std::vector<int32_t> Draws::tokens(int64_t count, int64_t content) {
  std::vector<int32_t> out(static_cast<size_t>(count));
  for (auto& t : out) t = static_cast<int32_t>(below(static_cast<uint64_t>(content)));
  return out;
}

KeysAndValues draw_keys_and_values(Draws& draw, const TaskParams& params, int64_t n_keys, int64_t n_values,
                                   int64_t content) {
  KeysAndValues out;
  while (static_cast<int64_t>(out.keys.size()) < n_keys) {
    std::vector<int32_t> k = draw.tokens(params.key_length, content);
    if (!contains(out.keys, k)) out.keys.push_back(std::move(k));
  }
  const uint64_t spread = static_cast<uint64_t>(params.value_length_max - params.value_length_min + 1);
  while (static_cast<int64_t>(out.values.size()) < n_values) {
    const int64_t len = params.value_length_min + static_cast<int64_t>(draw.below(spread));
    std::vector<int32_t> v = draw.tokens(len, content);
    if (!contains(out.values, v)) out.values.push_back(std::move(v));
  }
  return out;
}

std::string task_name(Task task) {
  switch (task) {
    case Task::single: return "single";
    case Task::multikey: return "multikey";
    case Task::multivalue: return "multivalue";
    case Task::multiquery: return "multiquery";
    case Task::vartrack: return "vartrack";
    case Task::cwe: return "cwe";
    case Task::fwe: return "fwe";
  }
  return "?";
}

Task parse_task(const std::string& name) {
  for (Task t : {Task::single, Task::multikey, Task::multivalue, Task::multiquery, Task::vartrack, Task::cwe, Task::fwe}) {
    if (task_name(t) == name) return t;
  }
  HYDRA_USER_FAIL("unknown NIAH task '{}' (known tasks: single, multikey, multivalue, multiquery, vartrack, cwe, fwe)",
                  name);
}

Markers markers_for(int64_t vocab_size) {
  HYDRA_USER_CHECK(vocab_size >= kReservedTokens + kMinContentTokens,
                   "a vocabulary of {} tokens is too small for NIAH tasks: {} ids are reserved for structure and at "
                   "least {} content ids are needed",
                   vocab_size, kReservedTokens, kMinContentTokens);
  const auto id = [&](int64_t from_top) { return static_cast<int32_t>(vocab_size - from_top); };
  return Markers{.needle = id(1), .is = id(2), .end = id(3), .query = id(4), .sep = id(5),
                 .content = vocab_size - kReservedTokens};
}

int64_t TaskParams::num_needles() const {
  switch (task) {
    case Task::single: return 1;
    case Task::multikey: return 1 + distractors;
    case Task::multivalue: return values;
    case Task::multiquery: return queries;
    case Task::vartrack: return chains * (hops + 1);
    case Task::cwe:
    case Task::fwe: return 0;
  }
  return 1;
}

int64_t TaskParams::max_answer_length() const {
  if (task != Task::single && task != Task::multikey && task != Task::multivalue) return ruler_max_answer_length(*this);
  return task == Task::multivalue ? values * value_length_max + (values - 1) : value_length_max;
}

int64_t TaskParams::min_length() const {
  if (task != Task::single && task != Task::multikey && task != Task::multivalue) return ruler_min_length(*this);
  return num_needles() * needle_length(value_length_max) + query_length() + max_answer_length();
}

void TaskParams::validate(int64_t vocab_size) const {
  HYDRA_USER_CHECK(key_length >= 1, "NIAH key length must be at least 1 token (got {})", key_length);
  HYDRA_USER_CHECK(value_length_min >= 1 && value_length_min <= value_length_max,
                   "NIAH value length {}..{} is not a range of at least 1 token", value_length_min, value_length_max);
  if (task == Task::multikey) HYDRA_USER_CHECK(distractors >= 1, "multikey needs at least 1 distractor (got {})", distractors);
  if (task == Task::multivalue) HYDRA_USER_CHECK(values >= 2, "multivalue needs at least 2 values (got {})", values);
  const Markers m = markers_for(vocab_size);
  if (task != Task::single && task != Task::multikey && task != Task::multivalue) {
    HYDRA_USER_CHECK(task == Task::cwe || task == Task::fwe || count_sequences(m.content, value_length_min) >= 2 * num_needles(),
                     "{} content tokens are too few to draw {} distinct values of {}+ tokens", m.content, num_needles(),
                     value_length_min);
    ruler_validate(*this, m);
    return;
  }
  // Distinct keys and values are drawn by rejection; half the space free keeps that quick.
  const int64_t needed = 2 * num_needles();
  HYDRA_USER_CHECK(count_sequences(m.content, key_length) >= needed && count_sequences(m.content, value_length_min) >= needed,
                   "{} content tokens are too few to draw {} distinct keys of {} tokens and values of {}+ tokens",
                   m.content, num_needles(), key_length, value_length_min);
}

Sample generate_sample(const TaskParams& params, int64_t vocab_size, uint64_t seed, int64_t length, int64_t depth,
                       int64_t index) {
  params.validate(vocab_size);
  const std::string name = task_name(params.task);
  HYDRA_USER_CHECK(depth >= 0 && depth <= 100, "NIAH depth {} is outside 0..100 (percent)", depth);
  HYDRA_USER_CHECK(index >= 0, "NIAH sample index {} is negative", index);
  HYDRA_USER_CHECK(length >= params.min_length(),
                   "length {} is too short for NIAH task {}: its needles, query and answer need up to {} tokens",
                   length, name, params.min_length());
  const Markers m = markers_for(vocab_size);
  if (params.task != Task::single && params.task != Task::multikey && params.task != Task::multivalue) {
    return generate_ruler_sample(params, m, seed, length, depth, index);
  }
  const std::string cell_key = fmt::format("{}/{}/{}", name, length, index);
  Draws draw(seed, hash_name("niah/" + cell_key));
  const RandomStream filler{seed, hash_name("niah-filler/" + cell_key)};

  // 1. Keys (one per needle for multikey, else one), then values, all distinct.
  const int64_t n_needles = params.num_needles();
  const int64_t n_keys = params.task == Task::multikey ? n_needles : 1;
  auto [keys, values] = draw_keys_and_values(draw, params, n_keys, n_needles, m.content);
  Sample s;
  s.length = length;
  s.depth = depth;
  s.index = index;
  s.key = keys[0];
  for (int64_t j = 0; j < n_needles; ++j) {
    s.needles.push_back(Needle{.position = 0, .key = keys[static_cast<size_t>(n_keys == 1 ? 0 : j)],
                               .value = values[static_cast<size_t>(j)]});
  }

  // 2. Sizes: answer, haystack region, filler count F.
  int64_t answer_length = 0;
  if (params.task == Task::multivalue) {
    for (const auto& v : values) answer_length += static_cast<int64_t>(v.size());
    answer_length += n_needles - 1;
  } else {
    answer_length = static_cast<int64_t>(values[0].size());
  }
  int64_t needles_total = 0;
  for (const auto& v : values) needles_total += params.needle_length(static_cast<int64_t>(v.size()));
  const int64_t region = length - params.query_length() - answer_length;
  const int64_t fill = region - needles_total;
  HYDRA_ASSERT(fill >= 0, "min_length admitted length {} without room for the needles", length);

  // 3. Insertion points in filler tokens: the primary at round(depth·F/100) (half up), the others
  //    uniform in [0, F]; context order by (point, tie rank, draw order).
  std::vector<int64_t> point(static_cast<size_t>(n_needles));
  point[0] = (2 * depth * fill + 100) / 200;
  for (int64_t j = 1; j < n_needles; ++j) point[static_cast<size_t>(j)] = static_cast<int64_t>(draw.below(static_cast<uint64_t>(fill + 1)));
  std::vector<int64_t> order(static_cast<size_t>(n_needles));
  std::iota(order.begin(), order.end(), 0);
  const int primary_tie = depth <= 50 ? -1 : 1;
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
    const auto rank = [&](int64_t j) { return std::pair{point[static_cast<size_t>(j)], j == 0 ? primary_tie : 0}; };
    return rank(x) < rank(y);
  });

  // 4. Assemble: filler and needles, query, answer.
  s.ids.reserve(static_cast<size_t>(length));
  int64_t filled = 0;
  const auto emit_filler_until = [&](int64_t until) {
    for (; filled < until; ++filled) {
      s.ids.push_back(static_cast<int32_t>(filler.bits(static_cast<uint64_t>(filled)) % static_cast<uint64_t>(m.content)));
    }
  };
  for (int64_t j : order) {
    Needle& needle = s.needles[static_cast<size_t>(j)];
    emit_filler_until(point[static_cast<size_t>(j)]);
    needle.position = static_cast<int64_t>(s.ids.size());
    s.ids.push_back(m.needle);
    s.ids.insert(s.ids.end(), needle.key.begin(), needle.key.end());
    s.ids.push_back(m.is);
    s.ids.insert(s.ids.end(), needle.value.begin(), needle.value.end());
    s.ids.push_back(m.end);
  }
  emit_filler_until(fill);
  s.ids.push_back(m.query);
  s.ids.insert(s.ids.end(), s.key.begin(), s.key.end());
  s.ids.push_back(m.is);
  s.answer_start = static_cast<int64_t>(s.ids.size());
  if (params.task == Task::multivalue) {
    for (size_t k = 0; k < order.size(); ++k) {
      if (k > 0) s.ids.push_back(m.sep);
      const auto& v = s.needles[static_cast<size_t>(order[k])].value;
      s.ids.insert(s.ids.end(), v.begin(), v.end());
    }
  } else {
    s.ids.insert(s.ids.end(), values[0].begin(), values[0].end());
  }
  s.answer_length = answer_length;
  s.needle_position = s.needles[0].position;
  HYDRA_ASSERT(static_cast<int64_t>(s.ids.size()) == length && s.answer_start + answer_length == length,
               "NIAH sample of {} tokens, answer at {}+{}, for length {}", s.ids.size(), s.answer_start, answer_length,
               length);
  return s;
}

TokenScore score_token(std::span<const float> logits, int32_t target) {
  HYDRA_ASSERT(target >= 0 && static_cast<size_t>(target) < logits.size(), "target {} outside a row of {} logits",
               target, logits.size());
  float best = -std::numeric_limits<float>::infinity();
  int32_t argmax = -1;
  for (size_t v = 0; v < logits.size(); ++v) {
    const float x = logits[v];
    if (std::isnan(x)) return TokenScore{-1, std::numeric_limits<double>::quiet_NaN()};
    if (argmax < 0 || x > best) {  // strict: the lowest id wins a tie
      best = x;
      argmax = static_cast<int32_t>(v);
    }
  }
  if (!std::isfinite(best)) return TokenScore{-1, std::numeric_limits<double>::quiet_NaN()};
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - best);
  return TokenScore{argmax, static_cast<double>(logits[static_cast<size_t>(target)]) - best - std::log(sum)};
}

namespace {
AnswerScore combine(std::vector<int32_t> predicted, std::span<const double> logprobs, std::span<const int32_t> answer) {
  AnswerScore out;
  out.correct = !answer.empty() && std::equal(answer.begin(), answer.end(), predicted.begin(), predicted.end());
  for (double lp : logprobs) out.logprob += lp;  // in answer order on every rank: the same sum everywhere
  out.predicted = std::move(predicted);
  return out;
}

}  // namespace

AnswerScore score_answer(const TensorView& logits, std::span<const int32_t> answer) {
  const int64_t n = static_cast<int64_t>(answer.size());
  expect_shape(logits, "answer logits", {{"n", n}, {"V", -1}});
  expect_dtype(logits, "answer logits", DType::f32);
  HYDRA_ASSERT(logits.on_host() && logits.stride(1) == 1, "answer logits must be host rows");
  std::vector<int32_t> predicted;
  std::vector<double> logprobs;
  for (int64_t j = 0; j < n; ++j) {
    const float* row = static_cast<const float*>(logits.data()) + j * logits.stride(0);
    const TokenScore t = score_token({row, static_cast<size_t>(logits.size(1))}, answer[static_cast<size_t>(j)]);
    predicted.push_back(t.argmax);
    logprobs.push_back(t.logprob);
  }
  return combine(std::move(predicted), logprobs, answer);
}

AnswerScore score_answer_rows(const Model& model, Communicator& comm, const SequenceLayout& layout,
                              const TensorView& hidden, int64_t answer_start, std::span<const int32_t> answer) {
  const int64_t n = static_cast<int64_t>(answer.size()), vocab = model.config().vocab_size;
  HYDRA_ASSERT(n >= 1 && answer_start >= 1 && answer_start + n <= layout.total_length(),
               "answer {}+{} outside a sequence of {}", answer_start, n, layout.total_length());
  expect_shape(hidden, "hidden", {{"T_loc", layout.local_length()}, {"D", model.config().hidden_size}});
  // The rows this rank owns among positions answer_start−1 .. answer_start+n−2: (answer index, local row).
  std::vector<std::pair<int64_t, int64_t>> mine;
  for (const Segment& s : layout.local_segments()) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t pos = answer_start - 1 + j;
      if (pos >= s.start && pos < s.start + s.length) mine.emplace_back(j, s.local_offset + (pos - s.start));
    }
  }
  // ints [2n]: arg-max + 1 (0 where another rank owns the row), then 1 where owned; logprob [n].
  // Every slot gets exactly one non-zero contribution, so the sums are exact copies.
  Tensor ints = Tensor::zeros({2 * n}, DType::i32);
  Tensor logprob = Tensor::zeros({n}, DType::f32);
  if (!mine.empty()) {
    const int64_t k = static_cast<int64_t>(mine.size());
    Tensor rows = Tensor::empty({k, hidden.size(1)}, hidden.dtype(), hidden.device());  // [k, D]
    for (int64_t i = 0; i < k; ++i) copy_into(rows.view().narrow(0, i, 1), hidden.narrow(0, mine[i].second, 1));
    Tensor logits = Tensor::empty({k, vocab}, DType::f32, model.device());  // [k, V]
    model.lm_head(logits, rows);
    const Tensor host = logits.device() == Device::host ? logits : to(logits, Device::host, DType::f32);
    for (int64_t i = 0; i < k; ++i) {
      const auto [j, row] = mine[static_cast<size_t>(i)];
      const TokenScore t = score_token({host.data_as<float>() + i * vocab, static_cast<size_t>(vocab)},
                                       answer[static_cast<size_t>(j)]);
      ints.data_as<int32_t>()[j] = t.argmax + 1;
      ints.data_as<int32_t>()[n + j] = 1;
      logprob.data_as<float>()[j] = static_cast<float>(t.logprob);
    }
  }
  // Every rank calls both reductions, owner of a row or not, in this order.
  all_reduce_sum_host(comm, ints);
  all_reduce_sum_host(comm, logprob);
  std::vector<int32_t> predicted(static_cast<size_t>(n));
  std::vector<double> logprobs(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    HYDRA_ASSERT(ints.data_as<int32_t>()[n + j] == 1, "answer row {} owned by {} ranks", j, ints.data_as<int32_t>()[n + j]);
    predicted[static_cast<size_t>(j)] = ints.data_as<int32_t>()[j] - 1;
    logprobs[static_cast<size_t>(j)] = logprob.data_as<float>()[j];
  }
  return combine(std::move(predicted), logprobs, answer);
}

AnswerScore evaluate_sample(const Model& model, Communicator& comm, const Sample& sample) {
  const int64_t total = static_cast<int64_t>(sample.ids.size());
  const SequenceLayout layout = group_layout(comm, total);
  Tensor ids = Tensor::empty({layout.local_length()}, DType::i32);  // [T_loc], local order
  for (const Segment& s : layout.local_segments()) {
    std::copy_n(sample.ids.begin() + s.start, s.length, ids.data_as<int32_t>() + s.local_offset);
  }
  ForwardContext context{comm, layout};
  const Tensor hidden = model.forward(context, ids);
  return score_answer_rows(model, comm, layout, hidden, sample.answer_start, sample.answer());
}

std::string scoring_name(Scoring scoring) { return scoring == Scoring::generate ? "generate" : "teacher-forced"; }

Scoring parse_scoring(const std::string& name) {
  if (name == "teacher-forced") return Scoring::teacher_forced;
  if (name == "generate") return Scoring::generate;
  HYDRA_USER_FAIL("--score: unknown scoring '{}' (use teacher-forced or generate)", name);
}

AnswerScore generate_answer(const Model& model, Communicator& comm, const Sample& sample, DecodeGraph cuda_graph) {
  const std::span<const int32_t> answer = sample.answer();
  const int64_t n = static_cast<int64_t>(answer.size()), vocab = model.config().vocab_size;
  HYDRA_ASSERT(n >= 1 && sample.answer_start >= 1, "answer {}+{}", sample.answer_start, n);
  const std::vector<std::vector<int32_t>> prompt = {
      std::vector<int32_t>(sample.ids.begin(), sample.ids.begin() + sample.answer_start)};
  // Greedy (temperature 0): the arg-max with ties to the lowest id, the rule score_token uses.
  const std::vector<GeneratedSequence> out =
      generate(comm, model, prompt, GenerateOptions{.max_new_tokens = n, .keep_logits = true, .cuda_graph = cuda_graph});
  const GeneratedSequence& seq = out.front();
  HYDRA_ASSERT(static_cast<int64_t>(seq.tokens.size()) == n && static_cast<int64_t>(seq.logits.size()) == n * vocab,
               "generation of {} tokens gave {} tokens, {} logits", n, seq.tokens.size(), seq.logits.size());
  std::vector<double> logprobs;
  for (int64_t j = 0; j < n; ++j) {
    const std::span<const float> row(seq.logits.data() + j * vocab, static_cast<size_t>(vocab));
    logprobs.push_back(score_token(row, seq.tokens[static_cast<size_t>(j)]).logprob);
  }
  return combine(seq.tokens, logprobs, answer);
}

std::vector<std::vector<int32_t>> answer_items(std::span<const int32_t> answer, int32_t separator) {
  std::vector<std::vector<int32_t>> items(1);
  for (int32_t t : answer) {
    if (separator >= 0 && t == separator) {
      items.emplace_back();
    } else {
      items.back().push_back(t);
    }
  }
  std::erase_if(items, [](const std::vector<int32_t>& item) { return item.empty(); });
  return items;
}

double item_recall(std::span<const int32_t> output, const std::vector<std::vector<int32_t>>& items) {
  if (items.empty()) return 1.0;
  int64_t found = 0;
  for (const std::vector<int32_t>& item : items) {
    found += std::search(output.begin(), output.end(), item.begin(), item.end()) != output.end() ? 1 : 0;
  }
  return static_cast<double>(found) / static_cast<double>(items.size());
}

}  // namespace hydra::niah
