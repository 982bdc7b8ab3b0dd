// Needle-in-a-haystack (NIAH) evaluation: RULER-style retrieval tasks built in token space, and
// their scoring by teacher forcing in one prefill. `hydra eval-niah` (launch/cmd_eval_niah.cpp)
// drives these; the same samples can come from an HDF5 eval set (model/eval/niah_set.h), which is how
// natural-language sets built with a Hugging Face tokenizer (cluster/niah/build_niah_set.py) are run.
//
// Token space. The top kReservedTokens ids of the vocabulary mark structure; every other token
// (filler, keys, values) is a "content" id in [0, V − kReservedTokens). Deriving the markers from V
// keeps tiny vocabularies (256) working. Markers, by id:
//   V−1 NEEDLE   opens a needle          V−2 IS    separates a key from its value
//   V−3 END      closes a needle         V−4 QUERY opens the question
//   V−5 SEP      separates the values of a multivalue answer
//   V−8 .. V−6   reserved (unused in format version 1)
// A sample of length T (exactly T ids):
//   [ haystack region: filler with the needles inserted        ][ QUERY key IS ][ answer ]
//   needle  = NEEDLE key IS value END          key: key_length content ids, value: 2..4 by default
//   answer  = the queried key's value (single, multikey), or all of its values in context order
//             joined by SEP: v1 SEP v2 SEP v3 (multivalue).
// The answer span [answer_start, T) is the very end of the sample, so a causal model reads the
// whole context before it. Tasks:
//   single      one needle; the query asks for its key.
//   multikey    the needle plus `distractors` needles with other keys (all keys distinct; their
//               values differ from the true one); the query asks for the first needle's key.
//   multivalue  `values` needles with the same key and distinct values; the answer is all of them.
// Depth. Let F be the number of filler tokens (region length minus all needles). The primary
// needle (the one the query is about; multivalue: the first value drawn) is inserted after
// round(depth · F / 100) filler tokens, so depth 0 puts it at position 0 and depth 100 ends it
// right before the query. Other needles are inserted after a uniform random number of filler
// tokens in [0, F]; at equal insertion points the primary goes first when depth ≤ 50 and last
// otherwise (that keeps depths 0 and 100 exact), others in draw order.
// Determinism. Every draw is a counter-based RandomStream value: keys, values and the other
// needles' insertion points come from a stream keyed by (seed, task, length, sample index), the
// filler token at filler index i from a second stream with the same key. The depth only moves the
// primary needle: the samples of one (task, length, index) at different depths hold the same
// needles and the same filler, a controlled comparison across depths.
//
// Scoring (teacher forcing). Greedy decoding after the prompt ids[0, a) reproduces the answer
// exactly iff, for every j, the arg-max of the logits at position a−1+j given the reference prefix
// ids[0, a+j) is the reference token ids[a+j]: if the first j greedy tokens equal the reference,
// greedy's next input is exactly the teacher-forced prefix (causality: position a−1+j sees only
// ids[0, a+j), so appended answer tokens change nothing before them), and its next token is that
// arg-max; the first mismatch makes the generated text differ. So one prefill of the full sample
// gives the greedy verdict for all n answer tokens at once, and the answer log-probability
// Σ_j log softmax(logits[a−1+j])[ids[a+j]] comes with it. Ties are broken towards the lowest token
// id (the rule greedy decoding uses here); a row with a NaN or an infinite maximum predicts nothing
// (−1, log-probability NaN) and fails. The equality is exact in the math; in floats, a prefill and a token-by-token decode may sum in other
// orders, so a near-tie could flip — the prefill is this runtime's reference computation.
// Only the n rows that are needed go through lm_head (never [T, V] logits at long T).
//
// Scoring by generation (eval-niah --score generate): the prompt ids[0, a) is prefilled and n new
// tokens are decoded greedily with the cache (model/generate.h, the decode engine), exactly as a
// user's `hydra generate` would (the decode step replayed as a CUDA graph where one rank runs a
// sample on the GPU, unless DecodeGraph::off: the same tokens); the verdict is "the generated tokens are the answer". By the
// argument above it equals the teacher-forced verdict up to float summation order (a test holds
// them to each other on every sample). Recall: the answer's items (multivalue: its values, split at
// SEP; otherwise the whole answer) and the fraction of them that occur as contiguous runs in the
// output, in any order — RULER's string_match_all, on token ids (item_recall).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/decode_engine.h"
#include "model/model.h"
#include "runtime/random.h"

namespace hydra::niah {

// single, multikey, multivalue: NIAH (header comment); multiquery, vartrack, cwe, fwe: RULER's
// other families in the same token space (model/eval/ruler.h).
enum class Task { single, multikey, multivalue, multiquery, vartrack, cwe, fwe };

std::string task_name(Task task);
// UserError listing the known tasks.
Task parse_task(const std::string& name);

inline constexpr int64_t kReservedTokens = 8;
inline constexpr int64_t kMinContentTokens = 16;

// The structure markers of a vocabulary of size V (header comment).
struct Markers {
  int32_t needle = 0, is = 0, end = 0, query = 0, sep = 0;
  int64_t content = 0;  // content ids are [0, content)
};
// UserError when V leaves fewer than kMinContentTokens content ids.
Markers markers_for(int64_t vocab_size);

// How the samples of one task look. Lengths are in tokens.
struct TaskParams {
  Task task = Task::single;
  int64_t key_length = 2;
  int64_t value_length_min = 2;
  int64_t value_length_max = 4;
  int64_t distractors = 3;  // multikey: needles with other keys
  int64_t values = 3;       // multivalue: values of the queried key
  // RULER families (model/eval/ruler.h), with RULER's defaults.
  int64_t queries = 4;        // multiquery: keys asked in one query
  int64_t chains = 1;         // vartrack: chains of assignments
  int64_t hops = 4;           // vartrack: assignments after the first in each chain
  int64_t common_words = 10;  // cwe: words to answer
  int64_t common_freq = 30;   // cwe: occurrences of each common word
  int64_t uncommon_freq = 3;  // cwe: occurrences of each other word
  double zipf_alpha = 2.0;    // fwe: exponent of the word distribution
  int64_t fwe_words = 0;      // fwe: distinct words (0: a quarter of the occurrences)
  int64_t top_words = 3;      // fwe: words to answer

  int64_t num_needles() const;
  int64_t needle_length(int64_t value_length) const { return 3 + key_length + value_length; }
  int64_t query_length() const { return 2 + key_length; }
  int64_t max_answer_length() const;
  // The shortest sample that holds every needle, the query and the answer at the longest values.
  int64_t min_length() const;
  // UserErrors for impossible settings (and a vocabulary too small to draw distinct keys).
  void validate(int64_t vocab_size) const;
};

// Sequential draws from one counter-based stream: the i-th call reads value i, so a sample (or a
// synthetic training document, model/train/synth.h) depends only on the order of draws inside its
// generator, never on threads or ranks.
class Draws {
 public:
  Draws(uint64_t seed, uint64_t key) : rng_{seed, key} {}
  // Uniform in [0, n) (modulo bias below 2⁻⁴⁰ for the n used here).
  uint64_t below(uint64_t n) { return rng_.bits(next_++) % n; }
  // `count` ids uniform in [0, content).
  std::vector<int32_t> tokens(int64_t count, int64_t content);

 private:
  RandomStream rng_;
  uint64_t next_ = 0;
};

// `n_keys` distinct keys of params.key_length ids, then `n_values` distinct values of
// value_length_min..max ids, all below `content`, drawn by rejection in that order.
struct KeysAndValues {
  std::vector<std::vector<int32_t>> keys, values;
};
KeysAndValues draw_keys_and_values(Draws& draw, const TaskParams& params, int64_t n_keys, int64_t n_values,
                                   int64_t content);

struct Needle {
  int64_t position = 0;        // global position of its NEEDLE marker
  std::vector<int32_t> key;    // [key_length]
  std::vector<int32_t> value;  // [value length]
};

// One evaluation sample: token ids and where the answer is. Generated samples carry their needles;
// samples read from an eval set carry only the primary needle's position (−1 if unknown).
struct Sample {
  int64_t length = 0;         // the cell's length label (= ids.size() for generated samples)
  int64_t depth = 0;          // the cell's depth label, percent
  int64_t index = 0;          // index of the sample within its cell
  std::vector<int32_t> ids;   // [T]
  int64_t answer_start = 0;   // a: the answer is ids[a, a + answer_length); a ≥ 1
  int64_t answer_length = 0;  // n
  int64_t needle_position = -1;
  std::vector<int32_t> key;     // the queried key (generated samples)
  std::vector<Needle> needles;  // primary first, then the others in draw order (generated samples)

  std::span<const int32_t> answer() const {
    return std::span<const int32_t>(ids).subspan(static_cast<size_t>(answer_start), static_cast<size_t>(answer_length));
  }
};

// The sample of (seed, task, length, depth, index) for a vocabulary of size V. UserError if the
// length cannot hold it (see TaskParams::min_length) or the depth is outside 0..100.
Sample generate_sample(const TaskParams& params, int64_t vocab_size, uint64_t seed, int64_t length, int64_t depth,
                       int64_t index);

// The verdict on one answer.
struct AnswerScore {
  bool correct = false;            // every answer token is the arg-max given the reference prefix
  double logprob = 0;              // Σ log p(answer token | reference prefix)
  std::vector<int32_t> predicted;  // [n] arg-max at each answer position (−1: invalid row)
};

struct TokenScore {
  int32_t argmax = -1;  // lowest id among the maxima; −1 if the row holds a NaN or its max is ±inf
  double logprob = 0;   // log softmax(row)[target], max-subtracted, fp64 sum
};

// One logits row [V] (host f32) against its reference token.
TokenScore score_token(std::span<const float> logits, int32_t target);
// logits [n, V] (host f32): row j is the prediction for answer[j].
AnswerScore score_answer(const TensorView& logits, std::span<const int32_t> answer);

// The distributed scorer: `hidden` [T_loc, D] is this rank's output of model.forward over `layout`.
// Each rank runs lm_head on the rows of positions answer_start−1 .. answer_start+n−2 it owns (with
// the zigzag layout the answer's rows sit in the last one or two segments), scores them, and two
// small all-reduces (arg-max and ownership [2n] int32, log-probability [n] float32; every slot has
// exactly one non-zero contribution) give every rank every row's result. Every rank returns the
// same AnswerScore. Collective: all ranks call it, in the same order.
AnswerScore score_answer_rows(const Model& model, Communicator& comm, const SequenceLayout& layout,
                              const TensorView& hidden, int64_t answer_start, std::span<const int32_t> answer);

// One sample end to end: this rank's ids, the forward pass, the distributed scorer. Collective.
AnswerScore evaluate_sample(const Model& model, Communicator& comm, const Sample& sample);

enum class Scoring { teacher_forced, generate };
std::string scoring_name(Scoring scoring);
// "teacher-forced" or "generate"; UserError otherwise.
Scoring parse_scoring(const std::string& name);

// One sample scored by generation (header comment): predicted = the n greedy tokens, correct = they
// are the answer, logprob = Σ log p of the generated tokens (the answer's log-probability when the
// verdict is correct). Collective over `comm` (every rank returns the same score). `cuda_graph` as
// GenerateOptions::cuda_graph (model/generate.h).
AnswerScore generate_answer(const Model& model, Communicator& comm, const Sample& sample,
                            DecodeGraph cuda_graph = DecodeGraph::automatic);

// The items of an answer: split at `separator` (a marker id), or the whole answer (separator < 0).
std::vector<std::vector<int32_t>> answer_items(std::span<const int32_t> answer, int32_t separator);
// The fraction of `items` that occur as contiguous runs in `output`, in any order (1 for no items).
double item_recall(std::span<const int32_t> output, const std::vector<std::vector<int32_t>>& items);

}  // namespace hydra::niah
