#include "model/train/synth.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/atomic_file.h"
#include "runtime/error.h"
#include "runtime/hdf5_file.h"
#include "runtime/random.h"

namespace hydra::synth {
namespace {

std::vector<double> zipf_cdf(int64_t n, double exponent) {
  std::vector<double> cdf(static_cast<size_t>(n));
  double sum = 0;
  for (int64_t r = 0; r < n; ++r) {
    sum += std::pow(static_cast<double>(r + 1), -exponent);
    cdf[static_cast<size_t>(r)] = sum;
  }
  for (double& c : cdf) c /= sum;
  cdf.back() = 1.0;
  return cdf;
}

// Index of the first cdf entry above u (u in (0, 1)).
int64_t invert(const std::vector<double>& cdf, double u) {
  const auto it = std::upper_bound(cdf.begin(), cdf.end(), u);
  return std::min<int64_t>(static_cast<int64_t>(it - cdf.begin()), static_cast<int64_t>(cdf.size()) - 1);
}

niah::TaskParams niah_params(const SynthConfig& c, Kind kind) {
  niah::TaskParams p = c.retrieval;
  p.task = niah::parse_task(kind_name(kind));  // the same names
  return p;
}

// mqar's keys and values drawn like a multikey sample's: `pairs` distinct keys and values.
niah::TaskParams mqar_params(const SynthConfig& c) {
  niah::TaskParams p = c.retrieval;
  p.task = niah::Task::multikey;
  p.distractors = c.mqar_pairs - 1;
  return p;
}

bool is_niah(Kind kind) { return kind != Kind::lm && kind != Kind::mqar && kind != Kind::recall; }

// Language filler continued across interruptions: the chain state is the last two filler tokens.
class Filler {
 public:
  Filler(const MarkovSource& language, uint64_t seed, const std::string& key)
      : language_(language), rng_{seed, hash_name(key)} {}
  int32_t next() {
    const double u = rng_.uniform(count_);
    const int32_t t = count_ < 2 ? language_.base_draw(u) : language_.next(b_, a_, u);
    ++count_;
    b_ = a_;
    a_ = t;
    return t;
  }

 private:
  const MarkovSource& language_;
  RandomStream rng_;
  uint64_t count_ = 0;
  int32_t b_ = 0, a_ = 0;
};

Document lm_document(const SynthConfig& c, const MarkovSource& language, int64_t index) {
  Document d{.kind = Kind::lm, .ids = {}, .answers = {}};
  Filler filler(language, c.seed, fmt::format("synth/lm/{}", index));
  d.ids.resize(static_cast<size_t>(c.seq_len));
  for (auto& t : d.ids) t = filler.next();
  return d;
}

Document mqar_document(const SynthConfig& c, const MarkovSource& language, int64_t index) {
  const niah::Markers m = niah::markers_for(c.vocab_size);
  const niah::TaskParams& p = c.retrieval;
  const int64_t pairs = c.mqar_pairs, queries = c.queries();
  niah::Draws draw(c.seed, hash_name(fmt::format("synth/mqar/{}", index)));
  const auto [keys, values] = niah::draw_keys_and_values(draw, p, pairs, pairs, m.content);
  // The queried pairs: the first `queries` of a Fisher-Yates shuffle of the pairs.
  std::vector<int64_t> asked(static_cast<size_t>(pairs));
  std::iota(asked.begin(), asked.end(), 0);
  for (int64_t j = 0; j < queries; ++j) {
    const int64_t k = j + static_cast<int64_t>(draw.below(static_cast<uint64_t>(pairs - j)));
    std::swap(asked[static_cast<size_t>(j)], asked[static_cast<size_t>(k)]);
  }
  asked.resize(static_cast<size_t>(queries));
  int64_t used = 0;
  for (int64_t j = 0; j < pairs; ++j) used += p.needle_length(static_cast<int64_t>(values[j].size()));
  for (int64_t q : asked) used += p.query_length() + static_cast<int64_t>(values[q].size());
  const int64_t fill = c.seq_len - used;
  HYDRA_ASSERT(fill >= 0, "validate admitted an mqar document that does not fit {} tokens", c.seq_len);
  // Insertion points in filler tokens, uniform in [0, fill]; needles in ascending point order.
  std::vector<std::pair<int64_t, int64_t>> points;  // (point, pair)
  for (int64_t j = 0; j < pairs; ++j) points.emplace_back(static_cast<int64_t>(draw.below(static_cast<uint64_t>(fill + 1))), j);
  std::stable_sort(points.begin(), points.end(), [](const auto& x, const auto& y) { return x.first < y.first; });

  Document d{.kind = Kind::mqar, .ids = {}, .answers = {}};
  d.ids.reserve(static_cast<size_t>(c.seq_len));
  Filler filler(language, c.seed, fmt::format("synth-filler/mqar/{}", index));
  int64_t filled = 0;
  for (const auto& [point, j] : points) {
    for (; filled < point; ++filled) d.ids.push_back(filler.next());
    d.ids.push_back(m.needle);
    d.ids.insert(d.ids.end(), keys[j].begin(), keys[j].end());
    d.ids.push_back(m.is);
    d.ids.insert(d.ids.end(), values[j].begin(), values[j].end());
    d.ids.push_back(m.end);
  }
  for (; filled < fill; ++filled) d.ids.push_back(filler.next());
  for (int64_t q : asked) {
    d.ids.push_back(m.query);
    d.ids.insert(d.ids.end(), keys[q].begin(), keys[q].end());
    d.ids.push_back(m.is);
    d.answers.push_back(Span{static_cast<int64_t>(d.ids.size()), static_cast<int64_t>(values[q].size())});
    d.ids.insert(d.ids.end(), values[q].begin(), values[q].end());
  }
  HYDRA_ASSERT(static_cast<int64_t>(d.ids.size()) == c.seq_len, "mqar document of {} tokens for {}", d.ids.size(),
               c.seq_len);
  return d;
}

// Zoology's layout: k1 v1 … kN vN, then each key once as a bare query followed by its value (the
// answer), the queries at random places among language filler.
Document recall_document(const SynthConfig& c, const MarkovSource& language, int64_t index) {
  const int64_t pairs = c.recall_pairs, queries = c.recall_queries(), half = c.recall_tokens / 2;
  const int64_t key0 = c.language_content(), value0 = key0 + half;
  HYDRA_ASSERT(pairs >= 1 && pairs <= half && queries >= 1, "recall documents of {} pairs need --recall-tokens ≥ {} (got {})",
               pairs, 2 * pairs, c.recall_tokens);
  niah::Draws draw(c.seed, hash_name(fmt::format("synth/recall/{}", index)));
  // Distinct keys: the first `pairs` of a partial Fisher-Yates shuffle of the key range; values with repetition.
  std::vector<int32_t> key_pool(static_cast<size_t>(half));
  std::iota(key_pool.begin(), key_pool.end(), static_cast<int32_t>(key0));
  for (int64_t j = 0; j < pairs; ++j) {
    const int64_t k = j + static_cast<int64_t>(draw.below(static_cast<uint64_t>(half - j)));
    std::swap(key_pool[static_cast<size_t>(j)], key_pool[static_cast<size_t>(k)]);
  }
  std::vector<int32_t> values(static_cast<size_t>(pairs));
  for (auto& v : values) v = static_cast<int32_t>(value0 + static_cast<int64_t>(draw.below(static_cast<uint64_t>(half))));
  // The asked pairs in random order.
  std::vector<int64_t> asked(static_cast<size_t>(pairs));
  std::iota(asked.begin(), asked.end(), 0);
  for (int64_t j = 0; j < queries; ++j) {
    const int64_t k = j + static_cast<int64_t>(draw.below(static_cast<uint64_t>(pairs - j)));
    std::swap(asked[static_cast<size_t>(j)], asked[static_cast<size_t>(k)]);
  }
  // The filler before each query: the region's spare tokens cut at `queries` uniform points.
  const int64_t spare = c.seq_len - 2 * pairs - 2 * queries;
  std::vector<int64_t> cuts(static_cast<size_t>(queries));
  for (auto& x : cuts) x = static_cast<int64_t>(draw.below(static_cast<uint64_t>(spare + 1)));
  std::sort(cuts.begin(), cuts.end());

  Document d{.kind = Kind::recall, .ids = {}, .answers = {}};
  d.ids.reserve(static_cast<size_t>(c.seq_len));
  for (int64_t j = 0; j < pairs; ++j) {
    d.ids.push_back(key_pool[static_cast<size_t>(j)]);
    d.ids.push_back(values[static_cast<size_t>(j)]);
  }
  Filler filler(language, c.seed, fmt::format("synth-filler/recall/{}", index));
  int64_t filled = 0;
  for (int64_t q = 0; q < queries; ++q) {
    for (; filled < cuts[static_cast<size_t>(q)]; ++filled) d.ids.push_back(filler.next());
    const int64_t j = asked[static_cast<size_t>(q)];
    d.ids.push_back(key_pool[static_cast<size_t>(j)]);
    d.answers.push_back(Span{static_cast<int64_t>(d.ids.size()), 1});
    d.ids.push_back(values[static_cast<size_t>(j)]);
  }
  for (; filled < spare; ++filled) d.ids.push_back(filler.next());
  HYDRA_ASSERT(static_cast<int64_t>(d.ids.size()) == c.seq_len, "recall document of {} tokens for {}", d.ids.size(),
               c.seq_len);
  return d;
}

Document niah_document(const SynthConfig& c, Kind kind, int64_t index) {
  niah::Draws draw(c.seed, hash_name(fmt::format("synth/depth/{}/{}", kind_name(kind), index)));
  const int64_t depth = static_cast<int64_t>(draw.below(101));
  const uint64_t niah_seed = mix64(c.seed ^ hash_name("synth"));
  niah::Sample s = niah::generate_sample(niah_params(c, kind), c.vocab_size, niah_seed, c.seq_len, depth, index);
  return Document{.kind = kind, .ids = std::move(s.ids), .answers = {Span{s.answer_start, s.answer_length}}};
}

}  // namespace

std::string kind_name(Kind kind) {
  switch (kind) {
    case Kind::lm: return "lm";
    case Kind::mqar: return "mqar";
    case Kind::single: return "single";
    case Kind::multikey: return "multikey";
    case Kind::multivalue: return "multivalue";
    case Kind::recall: return "recall";
    case Kind::multiquery: return "multiquery";
    case Kind::vartrack: return "vartrack";
    case Kind::cwe: return "cwe";
    case Kind::fwe: return "fwe";
  }
  return "?";
}

bool is_retrieval(Kind kind) { return kind != Kind::lm; }

int64_t SynthConfig::document_length(int64_t index) const {
  if (!packed()) return seq_len;
  const uint64_t span = static_cast<uint64_t>(doc_length_max - doc_length_min + 1);
  return doc_length_min + static_cast<int64_t>(RandomStream{seed, hash_name("synth/doc-length")}.bits(static_cast<uint64_t>(index)) % span);
}

int64_t SynthConfig::language_content() const { return niah::markers_for(vocab_size).content - recall_tokens; }

Kind parse_kind(const std::string& name) {
  for (Kind k : kAllKinds) {
    if (kind_name(k) == name) return k;
  }
  HYDRA_USER_FAIL("unknown synth task '{}' (known: lm, mqar, recall, single, multikey, multivalue, multiquery, vartrack, "
                  "cwe, fwe)", name);
}

std::vector<Part> parse_mixture(const std::string& spec) {
  std::vector<Part> out;
  std::stringstream in(spec);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    Part part{.kind = parse_kind(item.substr(0, colon)), .weight = 1.0};
    if (colon != std::string::npos) {
      const std::string w = item.substr(colon + 1);
      size_t used = 0;
      try {
        part.weight = std::stod(w, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      HYDRA_USER_CHECK(used == w.size() && used > 0 && std::isfinite(part.weight) && part.weight > 0,
                       "--task '{}': the weight of {} must be a positive number (got '{}')", spec,
                       kind_name(part.kind), w);
    }
    for (const Part& p : out) {
      HYDRA_USER_CHECK(p.kind != part.kind, "--task '{}': {} appears twice", spec, kind_name(part.kind));
    }
    out.push_back(part);
  }
  HYDRA_USER_CHECK(!out.empty(), "--task '{}' names no task (e.g. lm:0.5,mqar:0.3,single:0.2)", spec);
  double total = 0;
  for (const Part& p : out) total += p.weight;
  for (Part& p : out) p.weight /= total;
  return out;
}

std::string mixture_string(const std::vector<Part>& mixture) {
  std::string s;
  for (const Part& p : mixture) s += fmt::format("{}{}:{:.4g}", s.empty() ? "" : ",", kind_name(p.kind), p.weight);
  return s;
}

void LanguageParams::validate() const {
  HYDRA_USER_CHECK(branching >= 1, "--lm-branching must be at least 1 (got {})", branching);
  HYDRA_USER_CHECK(clusters >= 1, "--lm-clusters must be at least 1 (got {})", clusters);
  HYDRA_USER_CHECK(std::isfinite(zipf) && zipf >= 0 && std::isfinite(branch_zipf) && branch_zipf >= 0,
                   "--lm-zipf and --lm-branch-zipf must be non-negative numbers");
}

MarkovSource::MarkovSource(const LanguageParams& params, int64_t content)
    : content_(content), branching_(params.branching), clusters_(params.clusters) {
  params.validate();
  HYDRA_USER_CHECK(content >= 2, "the language needs at least 2 content tokens (got {})", content);
  HYDRA_USER_CHECK(content * clusters_ * branching_ <= (int64_t{1} << 26),
                   "the language's table ({} tokens × {} clusters × {} candidates) is too large", content, clusters_,
                   branching_);
  base_cdf_ = zipf_cdf(content, params.zipf);
  branch_cdf_ = zipf_cdf(branching_, params.branch_zipf);
  rank_token_.resize(static_cast<size_t>(content));
  std::iota(rank_token_.begin(), rank_token_.end(), 0);
  const RandomStream ranks{params.seed, hash_name("synth-language/ranks")};
  for (int64_t j = content - 1; j > 0; --j) {
    const int64_t k = static_cast<int64_t>(ranks.bits(static_cast<uint64_t>(j)) % static_cast<uint64_t>(j + 1));
    std::swap(rank_token_[static_cast<size_t>(j)], rank_token_[static_cast<size_t>(k)]);
  }
  token_rank_.resize(static_cast<size_t>(content));
  for (int64_t r = 0; r < content; ++r) token_rank_[static_cast<size_t>(rank_token_[static_cast<size_t>(r)])] = static_cast<int32_t>(r);
  const RandomStream clusters{params.seed, hash_name("synth-language/clusters")};
  cluster_.resize(static_cast<size_t>(content));
  for (int64_t t = 0; t < content; ++t) {
    cluster_[static_cast<size_t>(t)] = static_cast<int32_t>(clusters.bits(static_cast<uint64_t>(t)) % static_cast<uint64_t>(clusters_));
  }
  const RandomStream cand{params.seed, hash_name("synth-language/candidates")};
  candidates_.resize(static_cast<size_t>(content * clusters_ * branching_));
  for (size_t i = 0; i < candidates_.size(); ++i) candidates_[i] = base_draw(cand.uniform(i));
}

int32_t MarkovSource::base_draw(double u) const { return rank_token_[static_cast<size_t>(invert(base_cdf_, u))]; }

double MarkovSource::base_probability(int32_t token) const {
  const int32_t r = token_rank_[static_cast<size_t>(token)];
  return base_cdf_[static_cast<size_t>(r)] - (r == 0 ? 0.0 : base_cdf_[static_cast<size_t>(r - 1)]);
}

double MarkovSource::base_entropy() const {
  double h = 0;
  for (int64_t r = 0; r < content_; ++r) {
    const double p = base_cdf_[static_cast<size_t>(r)] - (r == 0 ? 0.0 : base_cdf_[static_cast<size_t>(r - 1)]);
    if (p > 0) h -= p * std::log(p);
  }
  return h;
}

double MarkovSource::next_entropy(int32_t b, int32_t a) const {
  double h = 0;
  for (const auto& [t, p] : next_distribution(b, a)) h -= p * std::log(p);
  return h;
}

int32_t MarkovSource::next(int32_t b, int32_t a, double u) const {
  const int64_t row = (static_cast<int64_t>(a) * clusters_ + cluster_of(b)) * branching_;
  return candidates_[static_cast<size_t>(row + invert(branch_cdf_, u))];
}

std::vector<std::pair<int32_t, double>> MarkovSource::next_distribution(int32_t b, int32_t a) const {
  const int64_t row = (static_cast<int64_t>(a) * clusters_ + cluster_of(b)) * branching_;
  std::vector<std::pair<int32_t, double>> out;
  for (int64_t j = 0; j < branching_; ++j) {
    const double p = branch_cdf_[static_cast<size_t>(j)] - (j == 0 ? 0.0 : branch_cdf_[static_cast<size_t>(j - 1)]);
    out.emplace_back(candidates_[static_cast<size_t>(row + j)], p);
  }
  std::sort(out.begin(), out.end());
  std::vector<std::pair<int32_t, double>> merged;
  for (const auto& [t, p] : out) {
    if (!merged.empty() && merged.back().first == t) {
      merged.back().second += p;
    } else {
      merged.emplace_back(t, p);
    }
  }
  return merged;
}

void SynthConfig::validate() const { validate_length(fmt::format("--seq-len {}", seq_len)); }

// `length_name` names the document length in messages: "--seq-len 256", or for a packed stream its
// shortest document ("--doc-length 64..200 (its shortest documents, 64 tokens)").
void SynthConfig::validate_length(const std::string& length_name) const {
  HYDRA_USER_CHECK(!mixture.empty(), "the mixture names no task");
  HYDRA_USER_CHECK(documents >= 1, "the stream needs at least one document (--tokens ≥ --seq-len)");
  HYDRA_USER_CHECK(seq_len >= 2, "--seq-len must be at least 2 (got {})", seq_len);
  if (packed()) {
    HYDRA_USER_CHECK(doc_length_min >= 2 && doc_length_max >= doc_length_min,
                     "--doc-length {}..{}: need 2 ≤ MIN ≤ MAX", doc_length_min, doc_length_max);
    SynthConfig shortest = *this;  // every kind must fit the shortest document
    shortest.seq_len = doc_length_min;
    shortest.doc_length_min = shortest.doc_length_max = 0;
    shortest.validate_length(fmt::format("--doc-length {}..{} (its shortest documents, {} tokens)", doc_length_min,
                                         doc_length_max, doc_length_min));
    return;
  }
  const niah::Markers m = niah::markers_for(vocab_size);
  language.validate();
  HYDRA_USER_CHECK(recall_tokens >= 0 && recall_tokens % 2 == 0 && m.content - recall_tokens >= 2,
                   "--recall-tokens {} must be even and leave the language at least 2 of the {} content ids", recall_tokens,
                   m.content);
  for (const Part& part : mixture) {
    if (is_niah(part.kind)) {
      const niah::TaskParams p = niah_params(*this, part.kind);
      p.validate(vocab_size);
      HYDRA_USER_CHECK(seq_len >= p.min_length(), "{} is too short for {} documents: they need up to {} tokens",
                       length_name, kind_name(part.kind), p.min_length());
    } else if (part.kind == Kind::mqar) {
      HYDRA_USER_CHECK(mqar_pairs >= 1, "--mqar-pairs must be at least 1 (got {})", mqar_pairs);
      HYDRA_USER_CHECK(mqar_queries >= 0 && queries() <= mqar_pairs,
                       "--mqar-queries must be in 1..--mqar-pairs ({}), or 0 for one per pair (got {})", mqar_pairs,
                       mqar_queries);
      const niah::TaskParams p = mqar_params(*this);
      p.validate(vocab_size);
      const int64_t need = mqar_pairs * p.needle_length(p.value_length_max) +
                           queries() * (p.query_length() + p.value_length_max);
      HYDRA_USER_CHECK(seq_len >= need,
                       "{} is too short for mqar documents of {} pairs and {} queries: they need up to {} "
                       "tokens", length_name, mqar_pairs, queries(), need);
    } else if (part.kind == Kind::recall) {
      HYDRA_USER_CHECK(recall_tokens > 0, "recall documents draw keys and values from reserved ids: set --recall-tokens "
                       "(e.g. {})", std::min<int64_t>(128, (m.content / 4) * 2));
      HYDRA_USER_CHECK(recall_pairs >= 1 && 2 * recall_pairs <= recall_tokens,
                       "--recall-pairs {} needs at least 2 × {} reserved ids (--recall-tokens is {}) for distinct keys",
                       recall_pairs, recall_pairs, recall_tokens);
      HYDRA_USER_CHECK(seq_len >= 2 * recall_pairs + 2,
                       "{} is too short for recall documents of {} pairs: they need at least {} tokens", length_name,
                       recall_pairs, 2 * recall_pairs + 2);
    }
  }
  (void)m;
}

std::vector<Kind> document_kinds(const SynthConfig& config) {
  const int64_t n = config.documents;
  std::vector<int64_t> count;
  std::vector<std::pair<double, size_t>> remainder;  // (fraction, part), largest first
  int64_t assigned = 0;
  for (size_t i = 0; i < config.mixture.size(); ++i) {
    const double exact = config.mixture[i].weight * static_cast<double>(n);
    const int64_t whole = static_cast<int64_t>(std::floor(exact));
    count.push_back(whole);
    assigned += whole;
    remainder.emplace_back(exact - static_cast<double>(whole), i);
  }
  std::stable_sort(remainder.begin(), remainder.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  for (int64_t r = 0; r < n - assigned; ++r) ++count[remainder[static_cast<size_t>(r) % remainder.size()].second];
  std::vector<Kind> kinds;
  kinds.reserve(static_cast<size_t>(n));
  for (size_t i = 0; i < config.mixture.size(); ++i) kinds.insert(kinds.end(), static_cast<size_t>(count[i]), config.mixture[i].kind);
  const RandomStream order{config.seed, hash_name("synth/order")};
  for (int64_t j = n - 1; j > 0; --j) {
    const int64_t k = static_cast<int64_t>(order.bits(static_cast<uint64_t>(j)) % static_cast<uint64_t>(j + 1));
    std::swap(kinds[static_cast<size_t>(j)], kinds[static_cast<size_t>(k)]);
  }
  return kinds;
}

Document generate_document(const SynthConfig& config, const MarkovSource& language, Kind kind, int64_t index) {
  switch (kind) {
    case Kind::lm: return lm_document(config, language, index);
    case Kind::mqar: return mqar_document(config, language, index);
    case Kind::recall: return recall_document(config, language, index);
    case Kind::single:
    case Kind::multikey:
    case Kind::multivalue:
    case Kind::multiquery:
    case Kind::vartrack:
    case Kind::cwe:
    case Kind::fwe: return niah_document(config, kind, index);
  }
  HYDRA_ASSERT(false, "unknown document kind");
  return {};
}

Stream generate_stream(const SynthConfig& config) {
  config.validate();
  const MarkovSource language(config.language, config.language_content());
  const bool masked = config.loss == LossMask::answers;
  Stream s;
  s.kinds = document_kinds(config);
  s.ids.reserve(static_cast<size_t>(config.documents * config.seq_len + 1));
  SynthConfig sized = config;  // a packed stream's documents each at their own length
  for (int64_t i = 0; i < config.documents; ++i) {
    const Kind kind = s.kinds[static_cast<size_t>(i)];
    sized.seq_len = config.document_length(i);
    if (config.packed()) s.document_offsets.push_back(static_cast<int64_t>(s.ids.size()));
    const Document d = generate_document(sized, language, kind, i);
    const int64_t base = static_cast<int64_t>(s.ids.size());
    for (const Span& a : d.answers) {
      s.answers.push_back(Span{base + a.start, a.length});
      s.answer_document.push_back(i);
    }
    s.ids.insert(s.ids.end(), d.ids.begin(), d.ids.end());
    if (masked) {  // a language document counts every target it holds, a retrieval document its answers
      s.loss_mask.insert(s.loss_mask.end(), d.ids.size(), is_retrieval(kind) ? uint8_t{0} : uint8_t{1});
      for (const Span& a : d.answers) {
        std::fill(s.loss_mask.begin() + base + a.start, s.loss_mask.begin() + base + a.start + a.length, uint8_t{1});
      }
    }
  }
  if (config.packed()) {  // no trailing token: the documents are marked
    s.document_offsets.push_back(static_cast<int64_t>(s.ids.size()));
    return s;
  }
  // The last window's last target (model/train/synth.h: Layout), counted as the last document's own.
  s.ids.push_back(language.base_draw(RandomStream{config.seed, hash_name("synth/tail")}.uniform(0)));
  if (masked) s.loss_mask.push_back(is_retrieval(s.kinds.back()) ? uint8_t{0} : uint8_t{1});
  return s;
}

double lm_loss_floor(const SynthConfig& config, const Stream& stream) {
  const MarkovSource language(config.language, config.language_content());
  const double base = language.base_entropy();
  if (config.packed()) {
    // Every counted target of the lm documents (a document's first token is another document's
    // crossing target, not counted): token 1 is a base draw, the others follow the table.
    double sum = 0;
    int64_t targets = 0;
    for (size_t d = 0; d < stream.kinds.size(); ++d) {
      if (stream.kinds[d] != Kind::lm) continue;
      const int32_t* ids = stream.ids.data() + stream.document_offsets[d];
      const int64_t n = stream.document_offsets[d + 1] - stream.document_offsets[d];
      for (int64_t i = 1; i < n; ++i) sum += i == 1 ? base : language.next_entropy(ids[i - 2], ids[i - 1]);
      targets += n - 1;
    }
    return targets > 0 ? sum / static_cast<double>(targets) : -1.0;
  }
  double sum = 0;
  int64_t windows = 0;
  for (size_t d = 0; d < stream.kinds.size(); ++d) {
    if (stream.kinds[d] != Kind::lm) continue;
    const int32_t* ids = stream.ids.data() + static_cast<int64_t>(d) * config.seq_len;
    double h = 2 * base;  // targets: token 1 and the next document's token 0
    for (int64_t i = 2; i < config.seq_len; ++i) h += language.next_entropy(ids[i - 2], ids[i - 1]);
    sum += h / static_cast<double>(config.seq_len);
    ++windows;
  }
  return windows > 0 ? sum / static_cast<double>(windows) : -1.0;
}

std::string config_json(const SynthConfig& c) {
  nlohmann::json mix = nlohmann::json::object();
  for (const Part& p : c.mixture) mix[kind_name(p.kind)] = p.weight;
  const niah::TaskParams& r = c.retrieval;
  return nlohmann::json{
      {"mixture", mix}, {"documents", c.documents}, {"seq_len", c.seq_len}, {"vocab_size", c.vocab_size},
      {"seed", c.seed},
      {"language", {{"seed", c.language.seed}, {"order", 2}, {"branching", c.language.branching},
                    {"clusters", c.language.clusters}, {"zipf", c.language.zipf}, {"branch_zipf", c.language.branch_zipf}}},
      {"retrieval", {{"key_length", r.key_length}, {"value_length_min", r.value_length_min},
                     {"value_length_max", r.value_length_max}, {"distractors", r.distractors}, {"values", r.values},
                     {"queries", r.queries}, {"chains", r.chains}, {"hops", r.hops}, {"common_words", r.common_words},
                     {"common_freq", r.common_freq}, {"uncommon_freq", r.uncommon_freq}, {"zipf_alpha", r.zipf_alpha},
                     {"fwe_words", r.fwe_words}, {"top_words", r.top_words}}},
      {"mqar", {{"pairs", c.mqar_pairs}, {"queries", c.queries()}}},
      {"recall", {{"tokens", c.recall_tokens}, {"pairs", c.recall_pairs}}},
      {"loss", c.loss == LossMask::answers ? "answers" : "all"},
      {"doc_length", c.packed() ? nlohmann::json{c.doc_length_min, c.doc_length_max} : nlohmann::json(nullptr)}}
      .dump();
}

void write_stream(const std::string& path, const SynthConfig& config, const Stream& stream) {
  const auto i64 = [](const std::vector<int64_t>& v) {
    Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::i64);
    std::copy(v.begin(), v.end(), t.data_as<int64_t>());
    return t;
  };
  Tensor ids = Tensor::empty({static_cast<int64_t>(stream.ids.size())}, DType::i32);
  std::copy(stream.ids.begin(), stream.ids.end(), ids.data_as<int32_t>());
  Tensor kinds = Tensor::empty({static_cast<int64_t>(stream.kinds.size())}, DType::i32);
  nlohmann::json names = nlohmann::json::array();
  for (Kind k : kAllKinds) names.push_back(kind_name(k));
  for (size_t i = 0; i < stream.kinds.size(); ++i) kinds.data_as<int32_t>()[i] = static_cast<int32_t>(stream.kinds[i]);
  std::vector<int64_t> start, length;
  for (const Span& a : stream.answers) {
    start.push_back(a.start);
    length.push_back(a.length);
  }
  AtomicFile out(path);
  H5File file = H5File::create(out.temp_path());
  file.set_attribute("format", std::string(kStreamFormat));
  file.set_attribute("format_version", kStreamVersion);
  file.set_attribute("kinds", names.dump());
  file.set_attribute("seq_len", config.seq_len);
  file.set_attribute("documents", config.documents);
  file.set_attribute("config", config_json(config));
  file.write("input_ids", ids);
  if (!stream.loss_mask.empty()) file.write_uint8("loss_mask", stream.loss_mask);
  if (!stream.document_offsets.empty()) {
    Tensor offsets = Tensor::empty({static_cast<int64_t>(stream.document_offsets.size())}, DType::i64);
    std::copy(stream.document_offsets.begin(), stream.document_offsets.end(), offsets.data_as<int64_t>());
    file.write("document_offsets", offsets);
  }
  file.write("document_kind", kinds);
  file.write("answer_start", i64(start));
  file.write("answer_length", i64(length));
  file.write("answer_document", i64(stream.answer_document));
  file.close();
  out.commit();
}

}  // namespace hydra::synth
