// hydra synth: a synthetic training or evaluation token stream (model/train/synth.h): retrieval tasks
// (mqar, the NIAH tasks) and a Zipfian Markov "language", mixed in stated proportions,
// deterministic from the seed. Parses the flags and calls synth::generate_stream; rank 0 writes.
#include <algorithm>
#include <chrono>
#include <iostream>

#include <nlohmann/json.hpp>

#include "launch/cli.h"
#include "model/train/synth.h"
#include "runtime/atomic_file.h"
#include "runtime/log.h"
#include "runtime/sizes.h"

namespace hydra {
namespace {

struct SynthOptions {
  std::string task, tokens, seq_len, out, value_length = "2..4", loss = "all", doc_length;
  int64_t vocab = 0, key_length = 2, distractors = 3, values = 3, mqar_pairs = 8, mqar_queries = 0;
  int64_t recall_tokens = 0, recall_pairs = 16;
  uint64_t seed = 0;
  synth::LanguageParams language;
  niah::TaskParams ruler;  // the RULER families' knobs (model/eval/ruler.h), as eval-niah takes them

  void bind(po::options_description& o) {
    o.add_options()
        ("task", po::value(&task)->required(), "mixture KIND[:WEIGHT],...: lm, mqar, recall, single, multikey, multivalue, multiquery, vartrack, cwe, fwe (the last four: eval-niah's RULER families, one sample per document; e.g. lm:0.4,mqar:0.3,single:0.1,multikey:0.1,multivalue:0.1); weights are normalised")
        ("tokens", po::value(&tokens)->required(), "stream size: floor(N / seq-len) documents of seq-len tokens (accepts 4M)")
        ("seq-len", po::value(&seq_len)->required(), "document length: the training length (hydra train --seq-len)")
        ("vocab", po::value(&vocab)->required(), "vocabulary size of the model (the top 8 ids are NIAH markers)")
        ("seed", po::value(&seed)->default_value(0), "stream seed: which documents (same seed, same file)")
        ("out", po::value(&out)->required(), "token file to write (.h5: input_ids and document metadata), atomically")
        ("language-seed", po::value(&language.seed)->default_value(1), "which language (transition table): keep it equal across training and held-out streams")
        ("lm-branching", po::value(&language.branching)->default_value(8), "language: candidates per context")
        ("lm-clusters", po::value(&language.clusters)->default_value(4), "language: classes of the token two back")
        ("lm-zipf", po::value(&language.zipf)->default_value(1.0), "language: Zipf exponent of the unigram base distribution")
        ("lm-branch-zipf", po::value(&language.branch_zipf)->default_value(1.0), "language: Zipf exponent over a context's candidates")
        ("key-length", po::value(&key_length)->default_value(2), "retrieval keys, tokens (as eval-niah --key-length)")
        ("value-length", po::value(&value_length)->default_value("2..4"), "retrieval values, tokens: N or MIN..MAX (as eval-niah)")
        ("distractors", po::value(&distractors)->default_value(3), "multikey: needles with other keys")
        ("values", po::value(&values)->default_value(3), "multivalue: values of the queried key")
        ("queries", po::value(&ruler.queries)->default_value(ruler.queries), "multiquery: keys asked in one query (as eval-niah)")
        ("chains", po::value(&ruler.chains)->default_value(ruler.chains), "vartrack: chains of assignments (as eval-niah)")
        ("hops", po::value(&ruler.hops)->default_value(ruler.hops), "vartrack: assignments after the first in each chain (as eval-niah)")
        ("common-words", po::value(&ruler.common_words)->default_value(ruler.common_words), "cwe: common words to answer (as eval-niah)")
        ("common-freq", po::value(&ruler.common_freq)->default_value(ruler.common_freq), "cwe: occurrences of each common word (as eval-niah)")
        ("uncommon-freq", po::value(&ruler.uncommon_freq)->default_value(ruler.uncommon_freq), "cwe: occurrences of each other word (as eval-niah)")
        ("zipf-alpha", po::value(&ruler.zipf_alpha)->default_value(ruler.zipf_alpha), "fwe: Zipf exponent of the words (as eval-niah)")
        ("fwe-words", po::value(&ruler.fwe_words)->default_value(ruler.fwe_words), "fwe: distinct words, 0: a quarter of the occurrences (as eval-niah)")
        ("top-words", po::value(&ruler.top_words)->default_value(ruler.top_words), "fwe: most frequent words to answer (as eval-niah)")
        ("mqar-pairs", po::value(&mqar_pairs)->default_value(8), "mqar: key-value needles per document")
        ("mqar-queries", po::value(&mqar_queries)->default_value(0), "mqar: queries per document (0: one per pair)")
        ("recall-tokens", po::value(&recall_tokens)->default_value(0), "content ids reserved for recall keys (lower half) and values (upper half), taken from the top of the content range and removed from the language; recall documents need it")
        ("recall-pairs", po::value(&recall_pairs)->default_value(16), "recall: key-value pairs per document (each key then asked once while the document has room)")
        ("doc-length", po::value(&doc_length), "MIN..MAX: a packed stream of documents whose lengths are drawn from [MIN, MAX], marked by document_offsets (each runs as if alone); default: every document --seq-len tokens")
        ("loss", po::value(&loss)->default_value("all"), "all (no loss_mask) | answers (a loss_mask counting every target of lm documents and only the answers of retrieval documents)");
  }

  synth::SynthConfig config() const {
    synth::SynthConfig c;
    c.mixture = synth::parse_mixture(task);
    c.seq_len = parse_size(seq_len, "--seq-len");
    HYDRA_USER_CHECK(c.seq_len >= 2, "--seq-len must be at least 2 (got {})", c.seq_len);
    c.documents = parse_size(tokens, "--tokens") / c.seq_len;
    c.vocab_size = vocab;
    c.seed = seed;
    c.language = language;
    c.retrieval = ruler;
    c.retrieval.key_length = key_length;
    const size_t dots = value_length.find("..");
    const std::string lo = dots == std::string::npos ? value_length : value_length.substr(0, dots);
    const std::string hi = dots == std::string::npos ? value_length : value_length.substr(dots + 2);
    const std::vector<int64_t> a = parse_int_list(lo, "--value-length"), b = parse_int_list(hi, "--value-length");
    HYDRA_USER_CHECK(a.size() == 1 && b.size() == 1, "--value-length: '{}' is not N or MIN..MAX", value_length);
    c.retrieval.value_length_min = a[0];
    c.retrieval.value_length_max = b[0];
    c.retrieval.distractors = distractors;
    c.retrieval.values = values;
    c.mqar_pairs = mqar_pairs;
    c.mqar_queries = mqar_queries;
    if (!doc_length.empty()) {
      const size_t dd = doc_length.find("..");
      const std::vector<int64_t> lo = parse_int_list(dd == std::string::npos ? doc_length : doc_length.substr(0, dd), "--doc-length");
      const std::vector<int64_t> hi = parse_int_list(dd == std::string::npos ? doc_length : doc_length.substr(dd + 2), "--doc-length");
      HYDRA_USER_CHECK(lo.size() == 1 && hi.size() == 1, "--doc-length: '{}' is not N or MIN..MAX", doc_length);
      c.doc_length_min = lo[0];
      c.doc_length_max = hi[0];
      HYDRA_USER_CHECK(c.doc_length_min >= 2 && c.doc_length_max >= c.doc_length_min,
                       "--doc-length {}: need 2 ≤ MIN ≤ MAX", doc_length);
      c.documents = parse_size(tokens, "--tokens") / ((c.doc_length_min + c.doc_length_max) / 2);
    }
    c.recall_tokens = recall_tokens;
    c.recall_pairs = recall_pairs;
    HYDRA_USER_CHECK(loss == "all" || loss == "answers", "--loss must be all or answers (got '{}')", loss);
    c.loss = loss == "answers" ? synth::LossMask::answers : synth::LossMask::all;
    c.validate();
    return c;
  }
};

}  // namespace

int run_synth(App& app, const std::vector<std::string>& args) {
  SynthOptions opt;
  po::options_description desc("hydra synth");
  opt.bind(desc);
  if (!parse_command_line(app, "synth", "--task MIX --tokens N --seq-len L --vocab V --seed S --out DATA.h5 [options]",
                          desc, args)) {
    return 0;
  }
  const synth::SynthConfig config = opt.config();
  require_writable_destination(opt.out, "token file");
  agree_on_run(app, {});  // the ranks were given the same command line (only rank 0 writes)
  if (app.world.rank() != 0) return 0;  // one writer; the stream is cheap to make
  const auto t0 = std::chrono::steady_clock::now();
  const synth::Stream stream = synth::generate_stream(config);
  synth::write_stream(opt.out, config, stream);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double floor = synth::lm_loss_floor(config, stream);
  nlohmann::json per_kind = nlohmann::json::object();
  for (const synth::Part& p : config.mixture) per_kind[synth::kind_name(p.kind)] = 0;
  for (synth::Kind k : stream.kinds) per_kind[synth::kind_name(k)] = per_kind[synth::kind_name(k)].get<int64_t>() + 1;
  // Packed streams (--doc-length) hold documents of varied lengths; the others documents of --seq-len.
  const std::string shape =
      stream.document_offsets.empty()
          ? fmt::format("{} documents of {} tokens", config.documents, config.seq_len)
          : fmt::format("{} packed documents of {}..{} tokens", stream.document_offsets.size() - 1,
                        config.doc_length_min, config.doc_length_max);
  log::info("synth: wrote {}: {} ({} ids), {} answers, mixture {}{}, {:.2f} s", opt.out, shape, stream.ids.size(),
            stream.answers.size(),
            synth::mixture_string(config.mixture),
            floor >= 0 ? fmt::format(", lm loss floor {:.4f} nats", floor) : std::string(), seconds);
  std::cout << nlohmann::json{{"command", "synth"}, {"out", opt.out}, {"tokens", stream.ids.size()},
                              {"documents", stream.document_offsets.empty() ? config.documents
                                                                          : static_cast<int64_t>(stream.document_offsets.size()) - 1},
                              {"seq_len", config.seq_len}, {"documents_per_kind", per_kind},
                              {"answers", stream.answers.size()},
                              {"counted_targets", stream.loss_mask.empty()
                                                      ? nlohmann::json(nullptr)
                                                      : nlohmann::json(std::count(stream.loss_mask.begin() + 1,
                                                                                  stream.loss_mask.end(), 1))},
                              {"lm_loss_floor", floor >= 0 ? nlohmann::json(floor) : nlohmann::json(nullptr)},
                              {"seconds", seconds}}
                   .dump()
            << std::endl;
  return 0;
}

}  // namespace hydra
