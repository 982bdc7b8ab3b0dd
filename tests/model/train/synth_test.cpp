// The synthetic stream generator (model/train/synth.h): exact proportions, determinism from the seeds,
// every retrieval answer present in its context, the layout `hydra train` windows rely on, and
// the Markov language's statistics against its exact transition table.
#include "model/train/synth.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "model/train/data.h"
#include "runtime/hdf5_file.h"
#include "runtime/token_file.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

using synth::Kind;

synth::SynthConfig base_config(const std::string& mix, int64_t documents, uint64_t seed = 7) {
  synth::SynthConfig c;
  c.mixture = synth::parse_mixture(mix);
  c.documents = documents;
  c.seq_len = 192;
  c.vocab_size = 200;
  c.seed = seed;
  return c;
}

const std::string kAll = "lm:0.4,mqar:0.3,single:0.1,multikey:0.1,multivalue:0.1";

TEST(Synth, MixtureParsing) {
  const auto m = synth::parse_mixture("lm:2,mqar:1,single");
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].kind, Kind::lm);
  EXPECT_DOUBLE_EQ(m[0].weight, 0.5);
  EXPECT_DOUBLE_EQ(m[1].weight, 0.25);
  EXPECT_DOUBLE_EQ(m[2].weight, 0.25);
  EXPECT_NE(error_of([] { synth::parse_mixture("lm:0.5,prose:0.5"); }).find("unknown synth task 'prose'"), std::string::npos);
  EXPECT_NE(error_of([] { synth::parse_mixture("lm:-1"); }).find("positive number"), std::string::npos);
  EXPECT_NE(error_of([] { synth::parse_mixture("lm:x"); }).find("positive number"), std::string::npos);
  EXPECT_NE(error_of([] { synth::parse_mixture("lm,lm"); }).find("appears twice"), std::string::npos);
  EXPECT_NE(error_of([] { synth::parse_mixture(","); }).find("names no task"), std::string::npos);
}

TEST(Synth, ExactProportionsShuffledBySeed) {
  const std::vector<Kind> kinds = synth::document_kinds(base_config(kAll, 1000));
  std::map<Kind, int> count;
  for (Kind k : kinds) ++count[k];
  EXPECT_EQ(count[Kind::lm], 400);
  EXPECT_EQ(count[Kind::mqar], 300);
  EXPECT_EQ(count[Kind::single], 100);
  EXPECT_EQ(count[Kind::multikey], 100);
  EXPECT_EQ(count[Kind::multivalue], 100);
  // Shuffled: the first 400 are not all lm, and another seed gives another order of the same counts.
  EXPECT_LT(std::count(kinds.begin(), kinds.begin() + 400, Kind::lm), 300);
  const std::vector<Kind> other = synth::document_kinds(base_config(kAll, 1000, 8));
  EXPECT_NE(kinds, other);
  std::map<Kind, int> other_count;
  for (Kind k : other) ++other_count[k];
  EXPECT_EQ(count, other_count);
  // Largest remainder: 7 documents at 1:1:1 are 3, 2, 2 (the tie goes to the first part).
  std::map<Kind, int> small;
  for (Kind k : synth::document_kinds(base_config("lm,mqar,single", 7))) ++small[k];
  EXPECT_EQ(small[Kind::lm], 3);
  EXPECT_EQ(small[Kind::mqar], 2);
  EXPECT_EQ(small[Kind::single], 2);
}

TEST(Synth, DeterministicFromTheSeeds) {
  synth::SynthConfig c = base_config(kAll, 60);
  c.retrieval.common_words = 4;  // the RULER kinds (cwe, fwe) at 192 tokens
  c.retrieval.common_freq = 5;
  c.retrieval.uncommon_freq = 2;
  c.retrieval.top_words = 2;
  const synth::Stream a = synth::generate_stream(c), b = synth::generate_stream(c);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.kinds, b.kinds);
  synth::SynthConfig other_seed = c;
  other_seed.seed = 8;
  EXPECT_NE(synth::generate_stream(other_seed).ids, a.ids);
  // Document i is a function of (seed, kind, i) alone: the stream's size does not change it.
  const synth::MarkovSource language(c.language, niah::markers_for(c.vocab_size).content);
  synth::SynthConfig longer = c;
  longer.documents = 500;
  for (Kind k : synth::kAllKinds) {
    if (k == Kind::recall) continue;  // needs reserved ids (Synth.RecallDocumentsAndAnswerMask)
    EXPECT_EQ(synth::generate_document(c, language, k, 5).ids, synth::generate_document(longer, language, k, 5).ids)
        << synth::kind_name(k);
    EXPECT_NE(synth::generate_document(c, language, k, 5).ids, synth::generate_document(c, language, k, 6).ids)
        << synth::kind_name(k);
  }
  // The language seed changes the language (an lm document) but not the NIAH samples.
  synth::SynthConfig other_language = c;
  other_language.language.seed = 2;
  const synth::MarkovSource language2(other_language.language, language.content());
  EXPECT_NE(synth::generate_document(c, language, Kind::lm, 0).ids,
            synth::generate_document(other_language, language2, Kind::lm, 0).ids);
  EXPECT_EQ(synth::generate_document(c, language, Kind::single, 0).ids,
            synth::generate_document(other_language, language2, Kind::single, 0).ids);
}

// recall: Zoology's layout with keys and values from the reserved ranges, every key asked once and
// answered by its own value, filler from the language only; the answers mode's loss_mask counts
// every target of lm documents and exactly the answers of recall documents; the language never
// emits a reserved id.
TEST(Synth, RecallDocumentsAndAnswerMask) {
  synth::SynthConfig c = base_config("lm:0.5,recall:0.5", 40);
  c.seq_len = 64;
  c.recall_tokens = 40;
  c.recall_pairs = 8;
  c.loss = synth::LossMask::answers;
  const int64_t key0 = c.language_content(), value0 = key0 + 20, end = value0 + 20;
  ASSERT_EQ(end, niah::markers_for(c.vocab_size).content);
  const synth::Stream s = synth::generate_stream(c);
  ASSERT_EQ(s.loss_mask.size(), s.ids.size());
  size_t answer = 0;
  for (int64_t d = 0; d < c.documents; ++d) {
    const int32_t* ids = s.ids.data() + d * c.seq_len;
    const uint8_t* mask = s.loss_mask.data() + d * c.seq_len;
    if (s.kinds[static_cast<size_t>(d)] == Kind::lm) {
      for (int64_t i = 0; i < c.seq_len; ++i) {
        EXPECT_LT(ids[i], key0) << "lm document " << d << " uses a reserved id";
        EXPECT_EQ(mask[i], 1);
      }
      continue;
    }
    std::map<int32_t, int32_t> value_of;
    for (int64_t j = 0; j < c.recall_pairs; ++j) {
      const int32_t k = ids[2 * j], v = ids[2 * j + 1];
      EXPECT_TRUE(k >= key0 && k < value0) << "key " << k;
      EXPECT_TRUE(v >= value0 && v < end) << "value " << v;
      EXPECT_TRUE(value_of.emplace(k, v).second) << "keys repeat in document " << d;
    }
    std::map<int32_t, int> asked;
    int64_t counted = 0;
    for (int64_t i = 2 * c.recall_pairs; i < c.seq_len; ++i) {
      if (ids[i] >= key0 && ids[i] < value0) {  // a query: its value follows and is an answer
        ++asked[ids[i]];
        ASSERT_LT(i + 1, c.seq_len);
        EXPECT_EQ(ids[i + 1], value_of.at(ids[i]));
        EXPECT_EQ(mask[i], 0);
        EXPECT_EQ(mask[i + 1], 1);
        ++counted;
        ASSERT_LT(answer, s.answers.size());
        EXPECT_EQ(s.answers[answer].start, d * c.seq_len + i + 1);
        EXPECT_EQ(s.answers[answer].length, 1);
        ++answer;
        ++i;
      } else {
        EXPECT_LT(ids[i], key0) << "filler in document " << d;
        EXPECT_EQ(mask[i], 0);
      }
    }
    EXPECT_EQ(static_cast<int64_t>(asked.size()), c.recall_queries());
    for (const auto& [k, n] : asked) EXPECT_EQ(n, 1) << "key " << k << " asked twice";
    EXPECT_EQ(counted, c.recall_queries());
    for (int64_t i = 0; i < 2 * c.recall_pairs; ++i) EXPECT_EQ(mask[i], 0);
  }
  EXPECT_EQ(answer, s.answers.size());
  // Refusals: recall without reserved ids, too many pairs for them, a document too short.
  synth::SynthConfig bad = c;
  bad.recall_tokens = 0;
  EXPECT_NE(error_of([&] { bad.validate(); }).find("set --recall-tokens"), std::string::npos);
  bad = c;
  bad.recall_pairs = 21;
  EXPECT_NE(error_of([&] { bad.validate(); }).find("distinct keys"), std::string::npos);
  bad = c;
  bad.recall_pairs = 20;
  bad.seq_len = 40;
  EXPECT_NE(error_of([&] { bad.validate(); }).find("too short for recall"), std::string::npos);
  bad = c;
  bad.recall_tokens = 7;
  EXPECT_NE(error_of([&] { bad.validate(); }).find("must be even"), std::string::npos);
}

// The answers mode for NIAH-style kinds: only the answer span of each retrieval document counts.
TEST(Synth, AnswerMaskOfNiahDocuments) {
  synth::SynthConfig c = base_config("single:0.5,mqar:0.5", 20);
  c.loss = synth::LossMask::answers;
  const synth::Stream s = synth::generate_stream(c);
  std::vector<uint8_t> expected(s.ids.size(), 0);
  for (const synth::Span& a : s.answers) std::fill(expected.begin() + a.start, expected.begin() + a.start + a.length, 1);
  EXPECT_EQ(s.loss_mask, expected);
  EXPECT_TRUE(synth::generate_stream(base_config("single", 3)).loss_mask.empty()) << "LossMask::all writes no mask";
}

TEST(Synth, LayoutMatchesTrainingWindows) {
  const TempDir dir;
  const synth::SynthConfig c = base_config(kAll, 40);
  const synth::Stream s = synth::generate_stream(c);
  ASSERT_EQ(static_cast<int64_t>(s.ids.size()), c.documents * c.seq_len + 1);
  for (int32_t id : s.ids) ASSERT_TRUE(id >= 0 && id < c.vocab_size);
  synth::write_stream(dir.file("s.h5"), c, s);
  EXPECT_EQ(read_token_file(dir.file("s.h5"), c.vocab_size), s.ids);
  const H5File f = H5File::open_read(dir.file("s.h5"));
  EXPECT_EQ(f.string_attribute("format"), synth::kStreamFormat);
  EXPECT_EQ(f.int_attribute("seq_len"), c.seq_len);
  EXPECT_EQ(f.read("document_kind").numel(), c.documents);
  EXPECT_EQ(f.read("answer_start").numel(), static_cast<int64_t>(s.answers.size()));
  // hydra train's window k is document k plus the next document's first token.
  const train::TokenWindows windows({dir.file("s.h5")}, c.seq_len, 0, c.vocab_size);
  ASSERT_EQ(windows.count(), c.documents);
  const synth::MarkovSource language(c.language, niah::markers_for(c.vocab_size).content);
  for (int64_t k : {int64_t{0}, int64_t{17}, c.documents - 1}) {
    const std::vector<int32_t> w = windows.window_in_order(k).ids;
    const synth::Document d = synth::generate_document(c, language, s.kinds[static_cast<size_t>(k)], k);
    EXPECT_TRUE(std::equal(d.ids.begin(), d.ids.end(), w.begin()));
  }
  // Every answer lies inside its own document.
  for (size_t i = 0; i < s.answers.size(); ++i) {
    const int64_t doc = s.answer_document[i], begin = doc * c.seq_len;
    EXPECT_GE(s.answers[i].start, begin + 1);
    EXPECT_LE(s.answers[i].start + s.answers[i].length, begin + c.seq_len);
  }
}

// The needle NEEDLE key IS value END of `key` in ids[0, end): its value (empty if none; the test
// fails if the key has two needles where one is expected).
std::vector<std::vector<int32_t>> values_of(const std::vector<int32_t>& ids, size_t end, const std::vector<int32_t>& key,
                                            const niah::Markers& m) {
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i + key.size() + 1 < end; ++i) {
    if (ids[i] != m.needle || !std::equal(key.begin(), key.end(), ids.begin() + static_cast<long>(i) + 1) ||
        ids[i + key.size() + 1] != m.is) {
      continue;
    }
    std::vector<int32_t> v;
    for (size_t j = i + key.size() + 2; j < end && ids[j] != m.end; ++j) v.push_back(ids[j]);
    out.push_back(v);
  }
  return out;
}

TEST(Synth, EveryMqarAnswerIsInItsContext) {
  synth::SynthConfig c = base_config("mqar", 1);
  c.mqar_pairs = 10;
  c.mqar_queries = 7;
  const niah::Markers m = niah::markers_for(c.vocab_size);
  const synth::MarkovSource language(c.language, m.content);
  for (int64_t index = 0; index < 50; ++index) {
    const synth::Document d = synth::generate_document(c, language, Kind::mqar, index);
    ASSERT_EQ(static_cast<int64_t>(d.ids.size()), c.seq_len);
    ASSERT_EQ(d.answers.size(), 7u);
    EXPECT_EQ(std::count(d.ids.begin(), d.ids.end(), m.needle), 10);
    const size_t first_query = static_cast<size_t>(std::find(d.ids.begin(), d.ids.end(), m.query) - d.ids.begin());
    std::vector<std::vector<int32_t>> asked;
    for (const synth::Span& a : d.answers) {
      // ids[a − key − 2 .. a): QUERY key IS
      const size_t at = static_cast<size_t>(a.start);
      ASSERT_EQ(d.ids[at - 1], m.is);
      ASSERT_EQ(d.ids[at - 2 - static_cast<size_t>(c.retrieval.key_length)], m.query);
      const std::vector<int32_t> key(d.ids.begin() + static_cast<long>(at) - 1 - c.retrieval.key_length,
                                     d.ids.begin() + static_cast<long>(at) - 1);
      const std::vector<int32_t> answer(d.ids.begin() + a.start, d.ids.begin() + a.start + a.length);
      const auto found = values_of(d.ids, first_query, key, m);
      ASSERT_EQ(found.size(), 1u) << "document " << index << ": the queried key has one needle before the queries";
      EXPECT_EQ(found[0], answer) << "document " << index;
      EXPECT_TRUE(std::find(asked.begin(), asked.end(), key) == asked.end()) << "a needle is queried once";
      asked.push_back(key);
    }
    // The queries follow one another to the end of the document.
    EXPECT_EQ(d.answers.back().start + d.answers.back().length, c.seq_len);
    for (size_t i = 0; i < first_query; ++i) EXPECT_NE(d.ids[i], m.query);
  }
}

TEST(Synth, NiahDocumentsAreEvalNiahSamplesWithTheirAnswerInContext) {
  const synth::SynthConfig c = base_config("single,multikey,multivalue", 1);
  const niah::Markers m = niah::markers_for(c.vocab_size);
  const synth::MarkovSource language(c.language, m.content);
  std::map<Kind, std::vector<int64_t>> needle_at;
  for (Kind k : {Kind::single, Kind::multikey, Kind::multivalue}) {
    for (int64_t index = 0; index < 30; ++index) {
      const synth::Document d = synth::generate_document(c, language, k, index);
      ASSERT_EQ(d.answers.size(), 1u);
      const synth::Span a = d.answers[0];
      EXPECT_EQ(a.start + a.length, c.seq_len);
      const size_t query = static_cast<size_t>(a.start - 2 - c.retrieval.key_length);
      ASSERT_EQ(d.ids[query], m.query);
      const std::vector<int32_t> key(d.ids.begin() + static_cast<long>(query) + 1, d.ids.begin() + a.start - 1);
      const std::vector<int32_t> answer(d.ids.begin() + a.start, d.ids.end());
      const auto found = values_of(d.ids, query, key, m);
      if (k == Kind::multivalue) {
        ASSERT_EQ(found.size(), static_cast<size_t>(c.retrieval.values));
        std::vector<int32_t> joined;
        for (const auto& v : found) {
          if (!joined.empty()) joined.push_back(m.sep);
          joined.insert(joined.end(), v.begin(), v.end());
        }
        EXPECT_EQ(joined, answer);
      } else {
        ASSERT_EQ(found.size(), 1u);
        EXPECT_EQ(found[0], answer);
      }
      // Where the first needle of the queried key starts.
      for (size_t i = 0; i < query; ++i) {
        if (d.ids[i] == m.needle && std::equal(key.begin(), key.end(), d.ids.begin() + static_cast<long>(i) + 1)) {
          needle_at[k].push_back(static_cast<int64_t>(i));
          break;
        }
      }
      // Not the sample eval-niah draws for its usual seeds at the same length and index.
      for (uint64_t eval_seed = 0; eval_seed < 4; ++eval_seed) {
        niah::TaskParams p = c.retrieval;
        p.task = k == Kind::single ? niah::Task::single : k == Kind::multikey ? niah::Task::multikey : niah::Task::multivalue;
        for (int64_t depth : {0, 50, 100}) {
          EXPECT_NE(niah::generate_sample(p, c.vocab_size, eval_seed, c.seq_len, depth, index).ids, d.ids);
        }
      }
    }
  }
  // Depths vary from document to document: the queried needle moves over most of the context
  // (multivalue: the earliest of its 3 needles, two of them at random points, so less).
  for (auto& [k, at] : needle_at) {
    ASSERT_EQ(at.size(), 30u);
    std::sort(at.begin(), at.end());
    EXPECT_GT(at.back() - at.front(), k == Kind::multivalue ? c.seq_len / 4 : c.seq_len / 2) << synth::kind_name(k);
  }
}

// The RULER families as training documents: each is eval-niah's sample of its kind (with synth's
// seed and a depth drawn per document), its answer span the sample's, and a stream of them is
// written whole (the mixture parser and the length check know the kinds).
TEST(Synth, RulerFamilyDocumentsAreEvalNiahSamples) {
  synth::SynthConfig c = base_config("multiquery,vartrack,cwe,fwe", 8);
  c.seq_len = 256;              // fwe's shortest sample is 202 tokens
  c.retrieval.common_freq = 5;  // cwe at 256 tokens
  c.retrieval.uncommon_freq = 2;
  c.retrieval.common_words = 4;
  c.validate_length("--seq-len 256");
  const niah::Markers m = niah::markers_for(c.vocab_size);
  const synth::MarkovSource language(c.language, m.content);
  for (Kind k : {Kind::multiquery, Kind::vartrack, Kind::cwe, Kind::fwe}) {
    niah::TaskParams p = c.retrieval;
    p.task = niah::parse_task(synth::kind_name(k));
    for (int64_t index = 0; index < 5; ++index) {
      const synth::Document d = synth::generate_document(c, language, k, index);
      ASSERT_EQ(static_cast<int64_t>(d.ids.size()), c.seq_len) << synth::kind_name(k);
      ASSERT_EQ(d.answers.size(), 1u);
      const synth::Span a = d.answers[0];
      EXPECT_EQ(a.start + a.length, c.seq_len);
      EXPECT_EQ(d.ids[static_cast<size_t>(a.start) - 1], m.is) << "the query ends with IS";
      EXPECT_LE(a.length, p.max_answer_length());
      // Some depth (0 for cwe and fwe, which have none) reproduces the document from synth's seed.
      const uint64_t niah_seed = mix64(c.seed ^ hash_name("synth"));
      bool found = false;
      for (int64_t depth = 0; depth <= 100 && !found; ++depth) {
        found = niah::generate_sample(p, c.vocab_size, niah_seed, c.seq_len, depth, index).ids == d.ids;
      }
      EXPECT_TRUE(found) << synth::kind_name(k) << " " << index;
    }
  }
  synth::SynthConfig tight = c;
  tight.retrieval.common_freq = 60;
  EXPECT_NE(error_of([&] { tight.validate_length("--seq-len 256"); }).find("too short for cwe documents"), std::string::npos);
}

// Entropy in nats of counts.
double entropy(const std::map<int32_t, int64_t>& counts) {
  double n = 0, h = 0;
  for (const auto& [t, c] : counts) n += static_cast<double>(c);
  for (const auto& [t, c] : counts) h -= static_cast<double>(c) / n * std::log(static_cast<double>(c) / n);
  return h;
}

TEST(Synth, LanguageFollowsItsTransitionTable) {
  // A small vocabulary so that contexts repeat often: 56 content ids, 4 clusters, 8 candidates.
  synth::SynthConfig c = base_config("lm", 2000);
  c.vocab_size = 64;
  c.seq_len = 256;
  const synth::Stream s = synth::generate_stream(c);
  const synth::MarkovSource language(c.language, 56);
  std::map<std::pair<int32_t, int32_t>, std::map<int32_t, int64_t>> by_context;  // (a, cluster(b)) -> next
  std::map<int32_t, std::map<int32_t, int64_t>> by_last;                          // a -> next
  std::map<std::pair<int32_t, int32_t>, int32_t> some_b;
  std::vector<int64_t> unigram(56, 0);
  for (int64_t d = 0; d < c.documents; ++d) {
    const int32_t* ids = s.ids.data() + d * c.seq_len;
    for (int64_t i = 0; i < c.seq_len; ++i) {
      ASSERT_LT(ids[i], 56);
      ++unigram[static_cast<size_t>(ids[i])];
      if (i < 2) continue;
      const std::pair<int32_t, int32_t> ctx{ids[i - 1], language.cluster_of(ids[i - 2])};
      ++by_context[ctx][ids[i]];
      ++by_last[ids[i - 1]][ids[i]];
      some_b[ctx] = ids[i - 2];
    }
  }
  // 1. Frequent contexts: the empirical next-token distribution is the table's (total variation
  //    below 0.05; with n ≥ 3000 draws the expected TV of 8 outcomes is ~0.02).
  int checked = 0;
  double h_context = 0, h_last = 0, h_exact = 0, n_context = 0, n_last = 0;
  for (const auto& [ctx, next] : by_context) {
    int64_t n = 0;
    for (const auto& [t, k] : next) n += k;
    const auto exact = language.next_distribution(some_b.at(ctx), ctx.first);
    double sum = 0, hx = 0;
    for (const auto& [t, p] : exact) {
      sum += p;
      hx -= p * std::log(p);
    }
    ASSERT_NEAR(sum, 1.0, 1e-12);
    for (const auto& [t, k] : next) {
      EXPECT_TRUE(std::any_of(exact.begin(), exact.end(), [&](const auto& e) { return e.first == t; }))
          << "token " << t << " after a context whose table does not list it";
    }
    h_context += entropy(next) * static_cast<double>(n);
    h_exact += hx * static_cast<double>(n);
    n_context += static_cast<double>(n);
    if (n < 3000) continue;
    double tv = 0;
    for (const auto& [t, p] : exact) {
      const auto it = next.find(t);
      tv += std::abs((it == next.end() ? 0.0 : static_cast<double>(it->second) / static_cast<double>(n)) - p);
    }
    EXPECT_LT(tv / 2, 0.05) << "context (" << ctx.first << ", cluster " << ctx.second << "), " << n << " draws";
    ++checked;
  }
  EXPECT_GE(checked, 10);
  for (const auto& [a, next] : by_last) {
    int64_t n = 0;
    for (const auto& [t, k] : next) n += k;
    h_last += entropy(next) * static_cast<double>(n);
    n_last += static_cast<double>(n);
  }
  h_context /= n_context;
  h_last /= n_last;
  h_exact /= n_context;
  // 2. The conditional entropy is the table's (the empirical one is biased low by finite counts),
  //    the token two back matters (second order: knowing only the last token leaves more), and
  //    both are far below the uniform ln 56 = 4.03 nats.
  EXPECT_NEAR(h_context, h_exact, 0.1);
  EXPECT_GT(h_last, h_context + 0.3);
  EXPECT_LT(h_exact, std::log(56.0) - 1.5);
  // 3. Zipfian unigrams: token frequency follows the base distribution's ranks. The stationary
  //    frequencies are the base probabilities only in expectation over the drawn table (56 × 4 × 8
  //    candidate draws), so the check is on the ends and on the rank correlation: the 10 most
  //    probable base tokens carry 0.64 of the base mass and the 10 least 0.04; empirically at least
  //    5 times as much, and Spearman ρ > 0.5.
  std::vector<double> base(56), freq(56);
  for (int32_t t = 0; t < 56; ++t) {
    base[static_cast<size_t>(t)] = language.base_probability(t);
    freq[static_cast<size_t>(t)] = static_cast<double>(unigram[static_cast<size_t>(t)]);
  }
  const auto ranks = [](const std::vector<double>& v) {
    std::vector<size_t> order(v.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return v[x] < v[y]; });
    std::vector<double> r(v.size());
    for (size_t i = 0; i < order.size(); ++i) r[order[i]] = static_cast<double>(i);
    return r;
  };
  const std::vector<double> rb = ranks(base), rf = ranks(freq);
  double d2 = 0;
  for (size_t i = 0; i < rb.size(); ++i) d2 += (rb[i] - rf[i]) * (rb[i] - rf[i]);
  const double rho = 1 - 6 * d2 / (56.0 * (56.0 * 56.0 - 1));
  EXPECT_GT(rho, 0.5);
  std::vector<size_t> by_base(56);
  std::iota(by_base.begin(), by_base.end(), 0);
  std::sort(by_base.begin(), by_base.end(), [&](size_t x, size_t y) { return base[x] > base[y]; });
  double top = 0, bottom = 0;
  for (size_t i = 0; i < 10; ++i) {
    top += freq[by_base[i]];
    bottom += freq[by_base[55 - i]];
  }
  EXPECT_GT(top, 5 * bottom) << "top " << top << " bottom " << bottom;
  // 4. The loss floor is the source's expected loss on these windows: the realised NLL of the true
  //    distributions on the same tokens agrees with it to sampling error (~1e-2 over 500K tokens).
  const double floor = synth::lm_loss_floor(c, s);
  double nll = 0;
  for (int64_t d = 0; d < c.documents; ++d) {
    const int32_t* ids = s.ids.data() + d * c.seq_len;
    for (int64_t i = 1; i <= c.seq_len; ++i) {
      const int32_t target = ids[i];  // i == seq_len: the next document's token 0 (or the tail)
      if (i == 1 || i == c.seq_len) {
        nll -= std::log(language.base_probability(target));
        continue;
      }
      double p = 0;
      for (const auto& [t, q] : language.next_distribution(ids[i - 2], ids[i - 1])) p += t == target ? q : 0;
      nll -= std::log(p);
    }
  }
  nll /= static_cast<double>(c.documents * c.seq_len);
  EXPECT_NEAR(nll, floor, 0.02);
  EXPECT_LT(floor, std::log(56.0) - 1.5);
  EXPECT_EQ(synth::lm_loss_floor(base_config("mqar", 3), synth::generate_stream(base_config("mqar", 3))), -1.0);
}

TEST(Synth, RefusesWhatDoesNotFit) {
  synth::SynthConfig c = base_config("mqar", 10);
  c.seq_len = 64;
  c.mqar_pairs = 8;
  EXPECT_NE(error_of([&] { c.validate(); }).find("too short for mqar documents"), std::string::npos);
  c.mqar_queries = 9;
  EXPECT_NE(error_of([&] { c.validate(); }).find("--mqar-queries"), std::string::npos);
  synth::SynthConfig n = base_config("multivalue", 10);
  n.seq_len = 20;
  EXPECT_NE(error_of([&] { n.validate(); }).find("too short for multivalue"), std::string::npos);
  synth::SynthConfig v = base_config("lm", 10);
  v.vocab_size = 20;
  EXPECT_NE(error_of([&] { v.validate(); }).find("too small"), std::string::npos);
  synth::SynthConfig e = base_config("lm", 0);
  EXPECT_NE(error_of([&] { e.validate(); }).find("at least one document"), std::string::npos);
}

}  // namespace
}  // namespace hydra::test
