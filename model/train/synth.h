// Synthetic token streams for models trained here (`hydra synth`): no pretrained checkpoint can be
// downloaded, so a teacher is pretrained on data this runtime generates. A stream mixes, in stated
// proportions, documents that need retrieval and documents that need language modelling:
//
//   lm          a "language": a Zipfian second-order Markov source over the content ids (below);
//   mqar        multi-query associative recall: `pairs` needles NEEDLE key IS value END scattered
//               through language filler, then `queries` questions QUERY key IS value back to back,
//               each about a distinct needle of the context, in random order;
//   single, multikey, multivalue
//               the NIAH samples of `hydra eval-niah` (model/eval/niah.h, reused, not copied), at a depth
//               drawn uniformly from 0..100 per document;
//   recall      Zoology-style multi-query associative recall (Arora et al. 2023), dense in answers:
//               `recall_pairs` pairs k v back to back (keys distinct), then queries that are bare keys
//               each followed by its value (the answer, one token), every key asked once in random
//               order at random places among language filler. Keys and values come from reserved
//               ranges disjoint from the language (`recall_tokens`, below), so a recall answer is
//               predictable only by looking it up.
//
// Token space is NIAH's (model/eval/niah.h): the top 8 ids are structure markers, content ids are
// [0, V − 8). mqar uses the same markers and key/value shapes as the NIAH tasks, so what a model
// learns from many queries per document is the circuit a NIAH query needs. With recall_tokens R > 0
// the top R content ids are reserved for recall: keys [V − 8 − R, V − 8 − R/2), values
// [V − 8 − R/2, V − 8); the language (and so every kind's filler) uses [0, V − 8 − R). NIAH and
// mqar keys and values still come from all content ids, as eval-niah draws them.
//
// Loss masks (LossMask::answers, `hydra synth --loss answers`): the stream carries a loss_mask
// (runtime/token_file.h) that counts every target of lm documents and only the answer tokens of
// retrieval documents (mqar, recall, NIAH), so the gradient of a retrieval document is all
// retrieval signal rather than a few answer tokens among unpredictable filler and keys.
//
// Packed streams (doc_length_min > 0, `hydra synth --doc-length MIN..MAX`): document i has a length
// drawn uniformly from [MIN, MAX] by (seed, i), the documents lie back to back without a trailing
// token, and the file's document_offsets (runtime/token_file.h) mark them, so training windows of
// any length hold several documents and parts of them, each running as if alone (DESIGN.md §3.6).
//
// Layout otherwise: every document is exactly seq_len tokens; the stream is the documents back to back plus
// one trailing token, documents·seq_len + 1 ids. `hydra train` cuts windows of seq_len + 1 with
// stride seq_len (model/train/data.h), so window k is document k (plus the first token of the
// next one as the last target): a NIAH sample is then one whole training sequence at the training
// length, as eval-niah presents it.
//
// Proportions are exact: document counts are the largest-remainder rounding of weight · documents,
// and the order of kinds is a Fisher-Yates shuffle from (seed). Determinism: document i is a pure
// function of (seed, its kind, i) and the language of (language seed): counter-based streams
// (runtime/random.h), no state shared between documents. NIAH documents use a seed derived from
// (seed, "synth"), so `eval-niah --seed S` never reproduces a training sample.
//
// The language. Each content token t has a rank in a Zipfian base distribution p(r) ∝ r^−zipf
// (ranks assigned by a permutation of the ids) and one of `clusters` classes. The next token after
// (…, b, a) is drawn from a candidate list C(a, class(b)) of `branching` tokens with weights
// ∝ (j + 1)^−branch_zipf (j = 0 .. branching−1); each candidate is an independent draw from the base
// distribution, keyed by (language seed, a, class(b), j). So the next token depends on the last two
// (second order), frequent tokens are frequent everywhere (Zipfian unigrams), and a model that
// learns the table reaches the source's conditional entropy (next_distribution gives the exact
// distribution; well below ln(V − 8) for the defaults). A document's first two tokens are base
// draws.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/eval/niah.h"

namespace hydra::synth {

// document_kind in a stream file indexes this list (recall was appended to keep the others' indices).
// multiquery, vartrack, cwe, fwe: eval-niah's RULER families (model/eval/ruler.h), one sample per document.
enum class Kind { lm, mqar, single, multikey, multivalue, recall, multiquery, vartrack, cwe, fwe };
inline constexpr Kind kAllKinds[] = {Kind::lm,         Kind::mqar,       Kind::single,   Kind::multikey, Kind::multivalue,
                                     Kind::recall,     Kind::multiquery, Kind::vartrack, Kind::cwe,      Kind::fwe};
bool is_retrieval(Kind kind);  // every kind but lm

// Which targets a stream's loss_mask counts: all (no mask written) or, in retrieval documents, only
// the answers.
enum class LossMask { all, answers };

std::string kind_name(Kind kind);
Kind parse_kind(const std::string& name);  // UserError listing the kinds

struct Part {
  Kind kind = Kind::lm;
  double weight = 1;  // normalised over the mixture
};
// "lm:0.4,mqar:0.3,single:0.1,multikey:0.1,multivalue:0.1" or "lm" (weight 1): weights > 0, each
// kind at most once. UserError otherwise.
std::vector<Part> parse_mixture(const std::string& spec);
std::string mixture_string(const std::vector<Part>& mixture);

struct LanguageParams {
  uint64_t seed = 1;       // which language: the same seed gives the same transition table
  int64_t branching = 8;   // candidates per context
  int64_t clusters = 4;    // classes of the token two back
  double zipf = 1.0;       // exponent of the base (unigram) distribution over ranks
  double branch_zipf = 1.0;
  void validate() const;
};

// The second-order Markov source over content ids [0, content).
class MarkovSource {
 public:
  MarkovSource(const LanguageParams& params, int64_t content);
  int64_t content() const { return content_; }
  int32_t cluster_of(int32_t token) const { return cluster_[static_cast<size_t>(token)]; }
  // The exact next-token distribution after (…, b, a): (token, probability), duplicates merged,
  // sorted by token.
  std::vector<std::pair<int32_t, double>> next_distribution(int32_t b, int32_t a) const;
  // Base-distribution draw from a uniform u in (0, 1).
  int32_t base_draw(double u) const;
  // The next token after (…, b, a) from a uniform u in (0, 1).
  int32_t next(int32_t b, int32_t a, double u) const;
  // Probability of `token` under the base distribution.
  double base_probability(int32_t token) const;
  // Entropies (nats) of the base distribution and of the next token after (…, b, a).
  double base_entropy() const;
  double next_entropy(int32_t b, int32_t a) const;

 private:
  int64_t content_ = 0, branching_ = 0, clusters_ = 0;
  std::vector<double> base_cdf_;      // [content] cumulative over ranks
  std::vector<int32_t> rank_token_;   // [content] rank -> token
  std::vector<int32_t> token_rank_;   // [content] token -> rank
  std::vector<int32_t> cluster_;      // [content]
  std::vector<double> branch_cdf_;    // [branching]
  std::vector<int32_t> candidates_;   // [content · clusters · branching]
};

struct SynthConfig {
  std::vector<Part> mixture;
  int64_t documents = 0;
  int64_t seq_len = 0;
  int64_t vocab_size = 0;
  uint64_t seed = 0;
  LanguageParams language;
  niah::TaskParams retrieval;  // key/value lengths, distractors, values (its `task` is set per kind)
  int64_t mqar_pairs = 8;
  int64_t mqar_queries = 0;  // 0: one per pair
  int64_t queries() const { return mqar_queries > 0 ? mqar_queries : mqar_pairs; }
  int64_t recall_tokens = 0;  // reserved content ids for recall keys (lower half) and values (upper half)
  int64_t recall_pairs = 16;
  LossMask loss = LossMask::all;
  int64_t doc_length_min = 0, doc_length_max = 0;  // packed streams; 0: every document seq_len tokens
  bool packed() const { return doc_length_min > 0; }
  int64_t document_length(int64_t index) const;  // seq_len, or the packed stream's draw for document `index`
  // The language's content ids: [0, language_content()).
  int64_t language_content() const;
  // recall documents: pairs, then one query per pair while they fit (at least one).
  int64_t recall_queries() const { return std::min(recall_pairs, (seq_len - 2 * recall_pairs) / 2); }
  // UserErrors: empty mixture, too small a vocabulary, a document kind that does not fit seq_len
  // (a packed stream's shortest document, named by its --doc-length).
  void validate() const;
  void validate_length(const std::string& length_name) const;
};

struct Span {
  int64_t start = 0, length = 0;
};

// One document of seq_len tokens and the answers inside it (positions within the document): the
// value after each mqar query, the NIAH answer.
struct Document {
  Kind kind = Kind::lm;
  std::vector<int32_t> ids;   // [seq_len]
  std::vector<Span> answers;  // in position order
};

// The kind of every document, in stream order (exact proportions, shuffled by the seed).
std::vector<Kind> document_kinds(const SynthConfig& config);
// Document `index` of the given kind (a pure function of (config, kind, index)).
Document generate_document(const SynthConfig& config, const MarkovSource& language, Kind kind, int64_t index);

struct Stream {
  std::vector<int32_t> ids;             // [documents · seq_len + 1]
  std::vector<uint8_t> loss_mask;       // [ids.size()] with LossMask::answers, else empty
  std::vector<int64_t> document_offsets; // [documents + 1] for packed streams, else empty
  std::vector<Kind> kinds;              // [documents]
  std::vector<Span> answers;            // stream positions, in order
  std::vector<int64_t> answer_document; // [answers.size()]
};
Stream generate_stream(const SynthConfig& config);

// The loss floor of the lm documents of a stream: the source's own expected next-token loss (nats),
// averaged over the seq_len predictions of each lm document's training window as `hydra train` and
// `hydra eval-lm` cut it (tokens 1 and the next document's token 0 are base draws, the others follow
// the table; exact for an lm-only stream, where the next document starts with a base draw too). No
// model can do better in expectation; −1 when the stream holds no lm document.
double lm_loss_floor(const SynthConfig& config, const Stream& stream);

inline constexpr const char* kStreamFormat = "hydrahead-synth";
inline constexpr int64_t kStreamVersion = 1;
// HDF5 (atomic): input_ids [N] int32 (what `hydra train` reads), loss_mask [N] uint8 (answers
// mode), document_kind [documents] int32 (index into the `kinds` attribute), answer_start,
// answer_length, answer_document [M] int64; attributes format, format_version, kinds (JSON list),
// seq_len, documents, config (JSON).
void write_stream(const std::string& path, const SynthConfig& config, const Stream& stream);
std::string config_json(const SynthConfig& config);

}  // namespace hydra::synth
